"""`trajflow bench scale`: how far one embedded stack goes, at 100, 1,000 and 5,000 trajectories in flight.

The stack is laid out as `trajflow up` lays it out, one process per worker (`trajflow.lab.bench.scale_workers`): the
Temporal dev server, the orchestrator (the real TrajectoryWorkflow), decode (the real activity on a simulated engine
that never batches turns out), env (the synthetic env), reward (the real activities, the real reward service over HTTP,
a LocalStore in RAM), so the orchestration itself is measured: every activity only sleeps for the workload's time.
At each level a closed loop keeps N TrajectoryWorkflows in flight: it counts the ended ones in visibility every
second and starts as many new ones. Once N run and those have ended (the warm-up), a window of `window_s` is
measured, or of the warm-up's length where that is longer; then starting stops and every trajectory is waited for
(the drain).

Per level: trajectories/s and activities/s over the window (activities per trajectory are fixed by the workload:
reset, a generate and a step per turn, close, score, save), the orchestration overhead per activity (p50/p99 of the
time an activity call spends outside its own body, from the traces of a share of the trajectories: the
workflow's span for the call minus its run on a worker), the CPU of each worker process, of the Temporal server,
the reward service and this driver, history sizes of a sample of finished trajectories, what saturates first, and
how many were lost (ended without completing). Before the levels, the floor (`trajflow.lab.bench.scale_floor`): one
workflow's no-op activities in sequence, alone, the least round trip any activity pays on this server.

Not covered: Docker sandboxes, real models, a persistent Temporal database (the dev server keeps it in memory),
several hosts. The figures describe this machine; `docs/results/capacity.md` extrapolates from them.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from trajflow.contracts.traces import ROOT_SPAN, RUN_PREFIX, SpanRecord, attr
from trajflow.lab.bench.sandboxes_report import percentile
from trajflow.lab.bench.scale_stack import ScaleStack, cpu_s, scale_stack

Say = Callable[[str], None]


@dataclass(frozen=True)
class ScaleWorkload:
    levels: tuple[int, ...] = (100, 1000, 5000)
    turns: int = 4
    decode_s: float = 10.0
    """Median seconds of one LLM turn (log-normal, σ 0.3) on the simulated engine, which never batches them out."""
    env_s: float = 10.0
    """Mean seconds of one env step (Gaussian, σ 20% of it)."""
    window_s: float = 90.0
    """Measured after a warm-up once N are in flight: until the N in flight then have ended, and at least one
    trajectory's time (so that they no longer end in the lockstep of their common start). The window is as long as
    that warm-up where it is longer: on a machine slower than the workload's times a trajectory outlasts a short
    window, and one that saw no trajectory end would measure nothing."""
    fill_timeout_s: float = 600.0
    drain_timeout_s: float = 300.0
    """How long the drain waits; trajectories still running then are reported as `unfinished`, not lost (they
    would finish; the bench's in-memory server ends with it)."""
    trace_share: float = 0.05
    """The share of trajectories traced (the overhead's sample)."""
    workflow_cache: int | None = None
    """The orchestrator's sticky workflow cache; None: the SDK's default (what `trajflow worker orchestrator` has)."""
    history_samples: int = 20
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.levels or min(self.levels) < 1:
            raise ValueError(f"levels must be whole numbers of trajectories >= 1, got {self.levels}")
        if self.turns < 1 or self.window_s <= 0 or self.decode_s < 0 or self.env_s < 0:
            raise ValueError("turns >= 1, window_s > 0 and delays >= 0, please")
        if not 0 < self.trace_share <= 1:
            raise ValueError(f"trace_share is a share of trajectories in (0, 1], got {self.trace_share}")

    @property
    def activities_per_trajectory(self) -> int:
        return 2 * self.turns + 4  # reset, generate + step per turn, close, score, save

    @property
    def trajectory_s(self) -> float:
        return self.turns * (self.decode_s + self.env_s)


def quick_scale(**fields: object) -> ScaleWorkload:
    """A smoke run (~2 min): 20 and 100 in flight, 3 short turns, 15-s windows."""
    base = ScaleWorkload(levels=(20, 100), turns=3, decode_s=1.0, env_s=1.0, window_s=15.0, trace_share=0.5)
    return replace(base, **fields)


@dataclass
class LevelFigures:
    in_flight: float
    """Mean trajectories in flight over the window."""
    trajectories_per_s: float
    activities_per_s: float
    overhead_ms: dict[str, float]
    lost: int
    """Ended without completing (failed, timed out, terminated)."""
    started: int
    completed: int
    unfinished: int
    """Still running when the drain stopped waiting."""
    not_completed: dict[str, int]
    """The lost ones by `execution status/trajflow status`."""
    cpu_cores: dict[str, float]
    history: dict[str, float]
    saturated: str
    fill_s: float
    drain_s: float
    demand_activities_per_s: float
    """What the workload asks at N in flight with zero overhead: N · activities per trajectory / trajectory time."""
    in_flight_timeline: list[tuple[float, int, int]] = field(default_factory=list)
    """(seconds since the level began, in flight, ended), every second."""
    warm_up_s: float = 0.0
    window_s: float = 0.0
    """The window measured: `ScaleWorkload.window_s`, or the warm-up's length where that was longer."""


class _Loop:
    """Keeps N trajectories of one level in flight: every second it counts the ended ones in visibility and starts
    as many new ones. In flight = started − ended (visibility lags a start by a little, never the other way)."""

    def __init__(self, st: ScaleStack, sw: ScaleWorkload, n: int, run_id: str) -> None:
        self.st, self.sw, self.n, self.run_id = st, sw, n, run_id
        self.started = 0
        self.starting = True
        self.timeline: list[tuple[float, int, int]] = []
        self.in_flight = 0
        """Started and not yet ended, at the last count."""

    def _request(self, i: int):
        from trajflow.contracts.trajectory import SamplingParams, StagePools, TrajectoryRequest
        from trajflow.lab.bench.synthetic_env import ENV_ID, SyntheticSpec

        sw = self.sw
        spec = SyntheticSpec(mean=sw.env_s, sigma=0.2 * sw.env_s, min_turns=sw.turns, max_turns=sw.turns)
        return TrajectoryRequest(
            env_id=ENV_ID,
            seed=sw.seed * 1_000_000 + i,
            env_kwargs=spec.as_kwargs(),
            max_turns=sw.turns,
            system_prompt="",
            sampling=SamplingParams(temperature=1.0, max_new_tokens=16),
            task=self.run_id,
            pools=StagePools(decode=self.st.pool, env=self.st.pool, reward=self.st.pool),
        )

    def workflow_id(self, i: int) -> str:
        return f"{self.run_id}-{i:06d}"

    async def _start(self, count: int) -> None:
        from trajflow.client import start_trajectory

        first, self.started = self.started, self.started + count
        sem = asyncio.Semaphore(64)

        async def one(i: int) -> None:
            async with sem:
                await start_trajectory(
                    self._request(i), client=self.st.client, task_queue=self.st.queue, workflow_id=self.workflow_id(i)
                )

        await asyncio.gather(*(one(i) for i in range(first, first + count)))

    async def _count(self, condition: str) -> int:
        # grouped by task, not run: a trajectory of a run reports to the run's workflow, which this bench has none of
        return (await self.st.client.count_workflows(f"TrajflowTask = '{self.run_id}' AND {condition}")).count

    async def ended(self) -> int:
        return await self._count("ExecutionStatus != 'Running'")

    async def completed(self) -> int:
        """Ended as completed (the workflow's own status says so), from visibility."""
        return await self._count("ExecutionStatus = 'Completed' AND TrajflowStatus = 'completed'")

    async def settled(self) -> tuple[int, int, dict[str, int]]:
        """(completed, ended, the others by status) once visibility agrees with itself: a workflow's close and its
        last search-attribute update reach visibility separately, so two reads a second apart must match."""
        last: tuple[int, int] | None = None
        for _ in range(30):
            now = (await self.completed(), await self.ended())
            if now == last:
                break
            last = now
            await asyncio.sleep(1.0)
        completed, ended = now
        others: dict[str, int] = {}
        if ended > completed:
            query = (
                f"TrajflowTask = '{self.run_id}' AND ExecutionStatus != 'Running' AND "
                "(ExecutionStatus != 'Completed' OR TrajflowStatus != 'completed')"
            )
            async for wf in self.st.client.list_workflows(query, limit=1000):
                status = wf.search_attributes.get("TrajflowStatus", ["?"])[0] if wf.search_attributes else "?"
                key = f"{wf.status.name if wf.status else '?'}/{status}"
                others[key] = others.get(key, 0) + 1
        return completed, ended, others

    async def run(self, t0: float) -> None:
        """Top up to N every second while starting (one visibility count a second: the load the bench adds); record
        (t, in flight, ended); end when every started one has ended."""
        while True:
            ended = await self.ended()
            self.in_flight = self.started - ended
            self.timeline.append((round(time.monotonic() - t0, 2), self.in_flight, ended))
            if self.starting:
                if self.n > self.in_flight:
                    await self._start(self.n - self.in_flight)
            elif ended >= self.started:
                return
            await asyncio.sleep(1.0)


async def _wait(predicate: Callable[[], bool], timeout_s: float, task: asyncio.Task[None]) -> float:
    """Seconds until `predicate` held (the loop's task failing ends it with its error); TimeoutError past the limit."""
    t0 = time.monotonic()
    while not predicate():
        if task.done():
            task.result()
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"not reached within {timeout_s:.0f} s")
        await asyncio.sleep(0.5)
    return time.monotonic() - t0


async def _level(st: ScaleStack, sw: ScaleWorkload, n: int, say: Say) -> LevelFigures:
    import uuid

    run_id = f"scale-{n}-{uuid.uuid4().hex[:6]}"
    loop = _Loop(st, sw, n, run_id)
    t0 = time.monotonic()
    task = asyncio.create_task(loop.run(t0))
    say(f"level {n}: starting {n} trajectories ({sw.turns} turns of ~{sw.decode_s + sw.env_s:.0f} s each)")
    fill_s = await _wait(lambda: loop.started >= n and loop.timeline[-1][1] >= 0.98 * n, sw.fill_timeout_s, task)
    say(f"level {n}: {loop.in_flight} in flight after {fill_s:.1f} s; warming up until they have ended")
    turned_over = loop.timeline[-1][2] + n
    warm_up_s = await _wait(lambda: loop.timeline[-1][2] >= turned_over, sw.fill_timeout_s, task)
    if warm_up_s < sw.trajectory_s:
        await asyncio.sleep(sw.trajectory_s - warm_up_s)
        warm_up_s = sw.trajectory_s
    window_s = max(sw.window_s, warm_up_s)
    say(f"level {n}: warmed up in {warm_up_s:.0f} s; measuring {window_s:.0f} s")
    cpu0 = {role: cpu_s(pid) for role, pid in st.pids.items()}
    done0, mark = await loop.completed(), len(loop.timeline)
    w0 = time.monotonic()
    await asyncio.sleep(window_s)
    window = time.monotonic() - w0
    cpu = {role: round((cpu_s(pid) - cpu0[role]) / window, 3) for role, pid in st.pids.items()}
    done1, in_window = await loop.completed(), loop.timeline[mark:]
    loop.starting = False
    say(f"level {n}: window over ({(done1 - done0) / window:.2f} trajectories/s); draining {loop.started} started")
    d0 = time.monotonic()
    try:
        await asyncio.wait_for(task, sw.drain_timeout_s)
    except TimeoutError:
        say(f"level {n}: drain stopped after {sw.drain_timeout_s:.0f} s with trajectories still running")
    drain_s = time.monotonic() - d0
    completed, ended, failures = await loop.settled()
    tps = (done1 - done0) / window
    await asyncio.sleep(2.0)  # the workers export their spans every half second
    overhead = overhead_ms(level_spans(st.traces_dir, run_id), run_id)
    history = await _histories(st, loop, sw.history_samples)
    figures = LevelFigures(
        in_flight=round(statistics.fmean(r for _, r, _ in in_window), 1) if in_window else 0.0,
        trajectories_per_s=round(tps, 3),
        activities_per_s=round(tps * sw.activities_per_trajectory, 1),
        overhead_ms=overhead,
        lost=ended - completed,
        started=loop.started,
        completed=completed,
        unfinished=loop.started - ended,
        not_completed=failures,
        cpu_cores=cpu,
        history=history,
        saturated="",
        fill_s=round(fill_s, 1),
        drain_s=round(drain_s, 1),
        demand_activities_per_s=round(n * sw.activities_per_trajectory / sw.trajectory_s, 1),
        in_flight_timeline=loop.timeline,
        warm_up_s=round(warm_up_s, 1),
        window_s=round(window, 1),
    )
    figures.saturated = saturation(figures, os.cpu_count() or 1)
    say(
        f"level {n}: {figures.trajectories_per_s} traj/s, {figures.activities_per_s} activities/s, overhead p50 "
        f"{overhead.get('p50', float('nan'))} ms p99 {overhead.get('p99', float('nan'))} ms, lost {figures.lost}, "
        f"unfinished {figures.unfinished}, "
        f"cpu {cpu}; saturated: {figures.saturated}"
    )
    return figures


def level_spans(traces_dir: Path, run_id: str) -> list[SpanRecord]:
    """The spans of the level's traced trajectories: their roots name the run, the rest share their trace ids."""
    from trajflow.observability.timeline import read_spans, span_files

    files = span_files(traces_dir)
    traces = {s.trace_id for s in read_spans(files, run_id) if s.name == ROOT_SPAN}
    return read_spans(files, trace_ids=traces)


def overhead_ms(spans: list[SpanRecord], run_id: str) -> dict[str, float]:
    """p50/p99 (ms) over the level's traced activity calls of: the workflow's span of the call minus the runs of
    its attempts on workers (scheduling, pick-up, result delivery and the workflow tasks around it)."""
    roots = {
        s.trace_id
        for s in spans
        if s.name == ROOT_SPAN and str(s.attributes.get(attr("workflow_id"), "")).startswith(run_id)
    }
    runs: dict[str, float] = {}
    calls: list[SpanRecord] = []
    for s in spans:
        if s.trace_id not in roots or s.parent_id is None:
            continue
        if s.name.startswith(RUN_PREFIX):
            runs[s.parent_id] = runs.get(s.parent_id, 0.0) + s.seconds * 1e3
        elif s.name != ROOT_SPAN:
            calls.append(s)
    # a call with a nested call inside (env.step around a recovery) is left out: its body is not one run
    values = sorted(c.seconds * 1e3 - runs[c.span_id] for c in calls if c.span_id in runs)
    if not values:
        return {"samples": 0}
    return {
        "p50": round(percentile(values, 50), 2),
        "p99": round(percentile(values, 99), 2),
        "mean": round(statistics.fmean(values), 2),
        "samples": len(values),
        "trajectories": len(roots),
    }


async def _histories(st: ScaleStack, loop: _Loop, samples: int) -> dict[str, float]:
    """Events and bytes of the histories of a spread sample of the level's trajectories."""
    step = max(1, loop.started // max(samples, 1))
    events, sizes = [], []
    for i in range(0, loop.started, step)[:samples]:
        history = await st.client.get_workflow_handle(loop.workflow_id(i)).fetch_history()
        events.append(len(history.events))
        sizes.append(sum(e.ByteSize() for e in history.events))
    if not events:
        return {}
    return {
        "samples": len(events),
        "events_mean": round(statistics.fmean(events), 1),
        "events_max": max(events),
        "bytes_mean": round(statistics.fmean(sizes)),
        "bytes_max": max(sizes),
    }


def saturation(f: LevelFigures, cores: int) -> str:
    """What ran out first, from CPU shares: the machine's cores, or one process's core (a Python worker runs one
    event loop; the server may use more)."""
    total = sum(f.cpu_cores.values())
    if total >= 0.85 * cores:
        parts = ", ".join(f"{r} {v:.2f}" for r, v in sorted(f.cpu_cores.items(), key=lambda kv: -kv[1]) if v >= 0.05)
        return f"the machine's {cores} cores ({total:.2f} busy: {parts})"
    busiest = max(f.cpu_cores, key=lambda r: f.cpu_cores[r], default=None)
    if busiest is not None and f.cpu_cores[busiest] >= 0.85:
        what = "the Temporal server" if busiest == "server" else f"the {busiest} process"
        return f"{what} ({f.cpu_cores[busiest]:.2f} of a core)"
    return f"nothing yet ({total:.2f} of {cores} cores busy): the workload's own delays set the pace"


async def run(sw: ScaleWorkload, cache_dir: Path, say: Say) -> dict:
    from trajflow.lab.bench.real_report import machine
    from trajflow.lab.bench.scale_floor import floor

    levels: dict[str, dict] = {}
    async with scale_stack(
        cache_dir,
        say,
        decode_s=sw.decode_s,
        trace_share=sw.trace_share,
        slots=4 * max(sw.levels),
        workflow_cache=sw.workflow_cache,
    ) as st:
        base = await floor(st.client, st.pids.get("server"))
        say(
            f"floor: {base['round_trip_ms']} ms per no-op activity round trip, alone, in sequence "
            f"({base['server_cpu_ms']} ms of server CPU each)"
        )
        for n in sw.levels:
            levels[str(n)] = asdict(await _level(st, sw, n, say))
    return {"workload": asdict(sw), "floor": base, "levels": levels, "machine": machine()}


def main(sw: ScaleWorkload, json_path: Path | None, cache_dir: Path, say: Say) -> int:
    import signal

    def interrupted(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")  # so the stack's processes are ended, not left behind

    signal.signal(signal.SIGTERM, interrupted)
    result = asyncio.run(run(sw, cache_dir, say))
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2) + "\n")
        say(f"wrote {json_path}")
    lost = sum(level["lost"] for level in result["levels"].values())
    return 1 if lost else 0
