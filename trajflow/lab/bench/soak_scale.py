"""`trajflow bench soak --scale`: steps of thousands of trajectories through the real Temporal stack here, in a sharded
run, audited for loss, with each step's time taken apart.

One training run on the embedded bench stack (`trajflow.lab.bench.stack`: the dev server, the simulated engine, a
one-turn synthetic env, the reward service and store, the simulated trainer): B = 8,192 by default (1,024 groups of
8), α = 1, 3 steps, sharded (`groups_per_shard` unset: shards of 64 groups past 512 in flight), with a history short
enough that the training workflow continues as new about once a step. Each step's wall time (between two step
records) is split into what the simulated trainer spent reading its groups' manifests from the store (`load_s`), its
compute (a sleep, `compute_s`), and the rest: waiting for the batch, i.e. the rollouts through the dev server, the
shards and the training workflow. Beside it, what the dev server carried: activities completed per second (counted on
the stack's workers), signals the training workflow received a step (group reports and shard ends, from its
histories), the CPU of the server and of this process (every worker runs in it).

The audit (`soak_scale_audit`): the run ended at version `steps`, each step trained B samples on B/n groups none of
which was trained twice and every group admitted was trained, every trajectory and shard it started is in
visibility and none is left running, none failed.

Not covered: faults (`trajflow chaos`), a production Temporal cluster (the dev server on this machine's cores is the
bottleneck: the figures of the project's own parts are reported apart from its throughput), real models and
sandboxes.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from temporalio.client import WorkflowHandle

from trajflow.contracts.training import TrainingResult
from trajflow.lab.bench.soak_scale_audit import RunHistory, audit_sharded, run_history, wait_closed
from trajflow.lab.bench.stack import BenchStack, embedded_stack
from trajflow.lab.bench.workload import Workload


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (0 when it is gone). The command name in /proc/PID/stat may hold spaces
    and parentheses, so the fields are counted from its closing parenthesis (utime and stime: fields 14 and 15)."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def server_pid() -> int | None:
    """The dev server this process started (a child running `temporal server start-dev`)."""
    me = str(os.getpid())
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if stat[1] == me and b"start-dev" in cmd:
            return int(proc.name)
    return None


Say = Callable[[str], None]


@dataclass(frozen=True)
class ScaleSoak:
    batch_size: int = 8_192
    group_size: int = 8
    alpha: int = 1
    steps: int = 3
    turn_s: float = 0.01
    """Seconds of the one decode and the one env step of a trajectory (both sleep)."""
    train_s: float = 1.0
    """The simulated trainer's compute a step (a sleep)."""
    groups_per_shard: int | None = None
    """None: the run's default (shards of 64 groups past 512 trajectories in flight)."""
    history_events: int | None = None
    """The training workflow continues as new at this many events; None: twice the groups of a step (at least 100),
    about once a step."""
    slots: int = 4_096
    """The simulated engine's concurrent sequences (more than the dev server lets run at once)."""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.batch_size % self.group_size:
            raise ValueError(
                f"need steps >= 1 and a batch of whole groups, got {self.steps} steps of {self.batch_size} in groups "
                f"of {self.group_size}"
            )

    def events(self) -> int:
        return self.history_events or max(100, 2 * self.batch_size // self.group_size)


def breakdown(records: list, seen: dict[int, tuple[float, int]], start: float) -> list[dict]:
    """Per step: its wall time (workflow time between step records) taken apart (`load_s`, `compute_s`, `rest_s`),
    and the activities the stack's workers completed between the moments the driver saw the step before and this one
    (`seen`: step -> driver time, activities completed so far)."""
    out, before, prev = [], 0.0, (start, 0)
    for r in records:
        wall = r.time_s - before
        load, compute = r.metrics.get("load_s", 0.0), r.metrics.get("compute_s", 0.0)
        at = seen.get(r.step, prev)
        span = at[0] - prev[0]
        out.append(
            {
                "step": r.step,
                "wall_s": round(wall, 2),
                "load_s": round(load, 3),
                "compute_s": round(compute, 3),
                "rest_s": round(wall - load - compute, 2),
                "trainer_s": round(r.train_s, 3),
                "trajectories": r.trajectories,
                "activities": at[1] - prev[1],
                "activities_per_s": round((at[1] - prev[1]) / span, 1) if span > 0 else None,
            }
        )
        before, prev = r.time_s, at
    return out


def signals_a_step(buckets: list[dict[str, int]], steps: int) -> dict[str, float]:
    """Signal name -> signals the training workflow received a step, on average over the run (a step's own bucket
    depends on when the batch happened to be ready)."""
    total = sum((Counter(bucket) for bucket in buckets), Counter[str]())
    return {name: round(count / steps, 1) for name, count in sorted(total.items())}


async def _watch(
    st: BenchStack, handle: WorkflowHandle[object, TrainingResult], sw: ScaleSoak, t0: float, acts0: int, say: Say
) -> tuple[TrainingResult, dict[int, tuple[float, int]]]:
    """Await the run's result, saying a line a step (and one a minute between); returns it and when the driver saw
    each step (driver time, activities completed since `acts0`)."""
    from temporalio.service import RPCError

    from trajflow.client import training_progress
    from trajflow.contracts import names

    waiter = asyncio.ensure_future(handle.result())
    seen: dict[int, tuple[float, int]] = {}
    last_line = t0

    def saw(records: list) -> None:
        nonlocal last_line
        now, acts = time.monotonic(), st.activities.total() - acts0
        for r in records:
            if r.step in seen:
                continue
            seen[r.step] = (now, acts)
            load, compute = r.metrics.get("load_s", 0.0), r.metrics.get("compute_s", 0.0)
            say(
                f"soak --scale: step {r.step}/{sw.steps} at {now - t0:.0f} s: {r.trajectories:,} trained, store load "
                f"{load:.2f} s, trainer compute {compute:.2f} s; {acts:,} activities so far ({acts / (now - t0):.0f}/s)"
            )
            last_line = now

    while not waiter.done():
        await asyncio.wait({waiter}, timeout=2.0)
        if waiter.done():
            break
        try:  # a query waits for a workflow task, which a busy worker may be slow to give
            progress = await asyncio.wait_for(training_progress(handle), timeout=10.0)
            saw(progress.recent)
        except (RPCError, TimeoutError):  # between two runs of a continue-as-new, or slow
            progress = None
        now = time.monotonic()
        if now - last_line >= 60:
            acts, saved = st.activities.total() - acts0, st.activities.completed[names.TRAJECTORY_SAVE]
            trained = f"{progress.counters.consumed:,}" if progress is not None else "?"
            say(
                f"soak --scale: at {now - t0:.0f} s: {saved:,} trajectories saved, {trained} trained; "
                f"{acts:,} activities ({acts / (now - t0):.0f}/s)"
            )
            last_line = now
    result = waiter.result()
    saw(result.history)
    return result, seen


async def _scale(st: BenchStack, sw: ScaleSoak, say: Say) -> dict:
    from trajflow.client import start_training
    from trajflow.contracts import names
    from trajflow.contracts.tasks import TaskConfig
    from trajflow.contracts.training import TrainingRunConfig, TrainingState
    from trajflow.contracts.trajectory import SamplingParams, StagePools
    from trajflow.lab.bench.synthetic_env import ENV_ID, SyntheticSpec

    spec = SyntheticSpec(mean=1.0, sigma=0.2, min_turns=1, max_turns=1)
    task = TaskConfig(
        name="synthetic",
        env_id=ENV_ID,
        env_kwargs=spec.as_kwargs(),
        max_turns=1,
        system_prompt="",
        sampling=SamplingParams(temperature=1.0, max_new_tokens=16),
        pools=StagePools(decode=st.pool, env=st.pool, reward=st.pool),
    )
    cfg = TrainingRunConfig(
        steps=sw.steps,
        batch_size=sw.batch_size,
        group_size=sw.group_size,
        alpha=sw.alpha,
        trainer_pool=st.pool,
        history_events_before_continue=sw.events(),
        groups_per_shard=sw.groups_per_shard,
        tasks=[task],
    )
    shard = cfg.shard_size()
    say(
        f"soak --scale: B = {sw.batch_size:,} ({sw.batch_size // sw.group_size:,} groups of {sw.group_size}), "
        f"alpha {sw.alpha}, {sw.steps} steps, shards of {shard} groups, continue-as-new at {sw.events():,} events"
    )
    if not cfg.shard_groups():
        raise ValueError(f"B = {sw.batch_size} runs direct (no shards): the scale mode measures a sharded run")
    run_id = f"soaks-{uuid.uuid4().hex[:6]}"
    st.trainer.set_step_s(run_id, sw.train_s)  # type: ignore[attr-defined]
    server = server_pid()
    cpu0 = {"server": cpu_s(server) if server else 0.0, "workers": cpu_s(os.getpid())}
    acts0, t0 = st.activities.total(), time.monotonic()
    handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)
    result, seen = await _watch(st, handle, sw, t0, acts0, say)
    wall = time.monotonic() - t0
    acts = st.activities.total() - acts0
    cpu = {
        "server": cpu_s(server) - cpu0["server"] if server else None,
        "workers": cpu_s(os.getpid()) - cpu0["workers"],
    }
    state = await handle.query(names.QUERY_STATE, result_type=TrainingState)
    closed = await wait_closed(st.client, run_id, result.counters.started, timeout_s=120.0)
    history: RunHistory = await run_history(st.client, run_id)
    problems = audit_sharded(result, state, history, closed, sw.steps, sw.batch_size, sw.group_size)
    steps = breakdown(result.history, seen, t0)
    for s, signals in zip(steps, history.signals_per_step, strict=False):
        s["signals"] = signals
    figures = {
        "run_id": run_id,
        "steps": result.version,
        "groups_per_shard": shard,
        "shards": closed.shards_total,
        "continued_as_new": len(history.runs) - 1,
        "wall_s": round(wall, 1),
        "per_step": steps,
        "signals_after_last_step": history.signals_per_step[-1] if history.signals_per_step else {},
        "signals_a_step": signals_a_step(history.signals_per_step, sw.steps),
        "continue_as_new_input_bytes": history.continue_bytes,
        "history_events_per_run": history.events,
        "activities": {
            "completed": acts,
            "per_s": round(acts / wall, 1),
            "per_trajectory": round(acts / max(1, result.counters.started), 2),
            "by_type": dict(st.activities.completed),
            "failed": st.activities.failed,
        },
        "cpu_cores": {role: round(v / wall, 2) if v is not None else None for role, v in cpu.items()},
        "counters": result.counters.model_dump(),
        "trajectories_by_status": closed.trajectories,
        "shards_by_status": closed.shard_status,
        "lost": problems,
    }
    say(
        f"soak --scale: {result.version} steps of B = {sw.batch_size:,} in {wall:.0f} s, "
        f"{figures['continued_as_new']} continue-as-new, {result.counters.started:,} trajectories in "
        f"{closed.shards_total} shards; {acts:,} activities ({acts / wall:.0f}/s); dev server "
        f"{figures['cpu_cores']['server']} cores, workers {figures['cpu_cores']['workers']} cores; "
        + ("nothing lost" if not problems else "LOST: " + "; ".join(problems))
    )
    return figures


async def run(sw: ScaleSoak, cache_dir: Path, say: Say) -> dict:
    w = Workload(batch_size=sw.batch_size, group_size=sw.group_size, slots=sw.slots, unit_s=sw.turn_s, decode_sigma=0.2)
    async with embedded_stack(w, cache_dir, say) as st:
        return {"workload": asdict(sw) | {"history_events": sw.events()}, **await _scale(st, sw, say)}


def main(sw: ScaleSoak, json_path: Path | None, cache_dir: Path, say: Say) -> int:
    figures = asyncio.run(run(sw, cache_dir, say))
    if json_path is not None:
        json_path.write_text(json.dumps(figures, indent=2) + "\n")
        say(f"wrote {json_path}")
    return 1 if figures["lost"] else 0
