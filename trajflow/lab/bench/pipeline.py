"""`trajflow bench pipeline`: the sync/async ratio and trajectory- vs batch-level env interaction, measured in
one run on one embedded stack with the same workers (`trajflow.lab.bench.stack`), on a labelled synthetic workload
(`trajflow.lab.bench.workload`, where the default workload and the ideal bound are defined).

Phases, in order, each printed as it ends:
1. calibration: B trajectories with every delay ~0, all at once: the orchestration ceiling (Temporal + workers
   on this machine), in trajectories and activities per second, to compare with what the workload asks for.
2. pilot: a sync run (α = 0 barrier, ~0 train time) measures the sync generation phase G; T = 0.3·G.
3. sync (α = 0, barrier), then α = 1 and α = 2, `steps` steps each, the trainer step a fixed sleep of T.
4. per env σ: B episodes as B TrajectoryWorkflows started at once (trajectory-level), and the same B episodes
   (same ids, hence the same lengths and env delays) in one BatchRolloutWorkflow (batch-level, lockstep).

How throughput is measured: tps = B·(N−1) / (t_N − t_1), with t_k the workflow time at which step k ended; the
first step (the pipeline fill) is left out, for every mode alike. Whole-run figures (B·N / t_N) are in the JSON
too. Rollout throughput in phase 4 = B / wall seconds from the first start to the last result.
Efficiency = the best async tps / ideal_tps, where (derived in `trajflow.lab.bench.workload`)

    ideal_tps = min( B / T , S / (E[turns] · E[decode]) ) / unit_s

the train step T being the critical path a step cannot beat (steps are serial) and S / (E[turns]·E[decode])
the decode capacity of S slots. The report adds the α-specific admission bound (α+1)·B / (E[group latency] + T).

Not covered: real models, real sandboxes, several hosts; the figures say how well trajflow's orchestration
overlaps a workload of this shape on this machine, not how fast any model trains.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trajflow.lab.bench.pipeline_report import render, summarize
from trajflow.lab.bench.stack import BenchStack, embedded_stack
from trajflow.lab.bench.workload import (
    Workload,
    generation_phases,
    group_latency_units,
    ideal_bound,
    mean,
    steady_tps,
    whole_run_tps,
)

Say = Callable[[str], None]
PILOT_TRAIN_S = 0.001
"""The pilot's train step: a sleep of ~0."""


@dataclass
class RunFigures:
    label: str
    alpha: int
    tps: float
    whole_tps: float
    step_times_s: list[float]
    wall_s: float
    staleness_mean: float
    dropped_stale: int
    max_in_flight: int
    decode_utilisation: float
    generation_phases_s: list[float]
    admission_s: list[float]
    """Sync runs: per step, from the first child start initiated to the B-th child started."""
    counters: dict[str, int]
    leftovers_terminated: int = 0
    """Trajectories of this run still running after it ended (terminated by the bench)."""
    continued_as_new: int = 0

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def _task(st: BenchStack, w: Workload, sigma: float):
    from trajflow.contracts.tasks import TaskConfig
    from trajflow.contracts.trajectory import SamplingParams, StagePools
    from trajflow.lab.bench.synthetic_env import ENV_ID, SyntheticSpec

    spec = SyntheticSpec(mean=w.env_mean, sigma=sigma, min_turns=w.min_turns, max_turns=w.max_turns)
    return TaskConfig(
        name="synthetic",
        env_id=ENV_ID,
        env_kwargs=spec.as_kwargs(),
        max_turns=max(8, w.max_turns),  # the env ends the episode, never this limit
        system_prompt="",
        sampling=SamplingParams(temperature=1.0, max_new_tokens=16),
        pools=StagePools(decode=st.pool, env=st.pool, reward=st.pool),
    )


async def _training_run(
    st: BenchStack, w: Workload, label: str, alpha: int, train_s: float, steps: int, first_seed: int, say: Say
) -> RunFigures:
    from trajflow.client import start_training
    from trajflow.contracts.training import TrainingRunConfig

    cfg = TrainingRunConfig(
        steps=steps,
        batch_size=w.batch_size,
        group_size=w.group_size,
        alpha=alpha,
        sync=alpha == 0,
        first_seed=first_seed,
        trainer_pool=st.pool,
        tasks=[_task(st, w, w.env_sigma)],
    )
    run_id = f"bench-s{w.seed}-{label}"
    st.trainer.set_step_s(run_id, train_s)  # type: ignore[attr-defined]
    st.engine.reset_stats()  # type: ignore[attr-defined]
    t0 = time.monotonic()
    handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)
    result = await _result_with_progress(handle, label, steps, t0, say)
    wall = time.monotonic() - t0
    util = st.engine.stats()["utilisation"]  # type: ignore[attr-defined]
    leftovers = await _terminate_leftovers(st, handle.id)
    times = [h.time_s for h in result.history]
    lags = [lag for h in result.history for lag, n in h.staleness.items() for _ in range(n)]
    admission, executions = await _admission_spans(st, handle.id, w.batch_size)
    if alpha:
        admission = []  # batches of B children are steps only under the barrier
    return RunFigures(
        label=label,
        alpha=alpha,
        tps=steady_tps(times, w.batch_size) if len(times) > 1 else whole_run_tps(times, w.batch_size),
        whole_tps=whole_run_tps(times, w.batch_size),
        step_times_s=times,
        wall_s=wall,
        staleness_mean=mean([float(x) for x in lags]),
        dropped_stale=result.counters.dropped_stale,
        max_in_flight=result.counters.max_in_flight,
        decode_utilisation=util,
        generation_phases_s=generation_phases(times, [h.train_s for h in result.history]) if alpha == 0 else [],
        admission_s=admission,
        counters=result.counters.model_dump(),
        leftovers_terminated=leftovers,
        continued_as_new=executions - 1,
    )


async def _terminate_leftovers(st: BenchStack, run_id: str, timeout_s: float = 10.0) -> int:
    """End the run's trajectories still running after it finished, so they do not load the next phase.

    Two things leave some: admission starts groups during the last train step that the run never uses, and a
    TrajectoryWorkflow treats its cancellation as a lost sandbox and carries on. Terminated, they run no more code.
    """
    query = f"WorkflowType = 'TrajectoryWorkflow' AND TrajflowRun = '{run_id}' AND ExecutionStatus = 'Running'"
    ended: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = [wf.id async for wf in st.client.list_workflows(query) if wf.id not in ended]
        if not running:
            break
        for wid in running:
            try:
                await st.client.get_workflow_handle(wid).terminate("bench: the run that started it has ended")
            except Exception:
                pass
            ended.add(wid)
        await asyncio.sleep(0.2)
    return len(ended)


async def _result_with_progress(handle, label: str, steps: int, t0: float, say: Say):
    """The run's result; meanwhile a line each time a step ends (the `progress` query, every 2 s)."""
    from trajflow.client import training_progress

    waiter = asyncio.ensure_future(handle.result())
    seen = 0
    while True:
        done, _ = await asyncio.wait({waiter}, timeout=2.0)
        if done:
            return waiter.result()
        version = (await training_progress(handle)).version
        if version > seen:
            seen = version
            say(f"  {label}: step {version}/{steps} done at {time.monotonic() - t0:.1f} s")


async def _admission_spans(st: BenchStack, run_id: str, batch_size: int) -> tuple[list[float], int]:
    """Per batch of B children (sync: one per step), seconds from the first start initiated to the last started,
    over every run of the workflow id (it may continue as new); and how many runs there were.
    Children are started one at a time, each awaiting its start, so this is the admission's own latency."""
    initiated: list[float] = []
    started: list[float] = []
    runs = [wf.run_id async for wf in st.client.list_workflows(f"WorkflowId = '{run_id}'")]
    for rid in runs:
        async for ev in st.client.get_workflow_handle(run_id, run_id=rid).fetch_history_events():
            if ev.HasField("start_child_workflow_execution_initiated_event_attributes"):
                initiated.append(ev.event_time.ToDatetime().timestamp())
            elif ev.HasField("child_workflow_execution_started_event_attributes"):
                started.append(ev.event_time.ToDatetime().timestamp())
    initiated.sort()
    started.sort()
    spans = [
        started[k + batch_size - 1] - initiated[k]
        for k in range(0, min(len(initiated), len(started)) - batch_size + 1, batch_size)
    ]
    return spans, len(runs)


async def _trajectory_level(st: BenchStack, reqs: list, ids: list[str]) -> tuple[float, list]:
    from trajflow.client import start_trajectory

    t0 = time.monotonic()
    handles = await asyncio.gather(
        *(
            start_trajectory(r, client=st.client, task_queue=st.queue, workflow_id=i)
            for r, i in zip(reqs, ids, strict=True)
        )
    )
    results = await asyncio.gather(*(h.result() for h in handles))
    return time.monotonic() - t0, results


async def _batch_level(st: BenchStack, reqs: list, ids: list[str]) -> tuple[float, object]:
    from trajflow.lab.bench.contracts import BATCH_ROLLOUT_WORKFLOW, BatchRolloutInput, BatchRolloutResult

    t0 = time.monotonic()
    result = await st.client.execute_workflow(
        BATCH_ROLLOUT_WORKFLOW,
        BatchRolloutInput(requests=reqs, episode_ids=ids),
        id=f"{ids[0]}-batch",
        task_queue=st.queue,
        result_type=BatchRolloutResult,
    )
    return time.monotonic() - t0, result


def _episodes(st: BenchStack, w: Workload, sigma: float, name: str, first_seed: int) -> tuple[list, list[str]]:
    task = _task(st, w, sigma)
    reqs = [task.request(first_seed + i) for i in range(w.batch_size)]
    return reqs, [f"{name}-e{i:03d}" for i in range(w.batch_size)]


async def _calibrate(st: BenchStack, w: Workload, say: Say) -> dict[str, float]:
    """B trajectories (8 when quick) with ~0 decode time and no env delay, all at once: what the orchestration
    alone sustains here."""
    import dataclasses

    engine = st.engine
    unit_s, engine.unit_s = engine.unit_s, 1e-6  # type: ignore[attr-defined]
    try:
        zero = dataclasses.replace(w, env_mean=0.0, batch_size=8 if w.quick else w.batch_size, group_size=1)
        reqs, ids = _episodes(st, zero, 0.0, f"cal-s{w.seed}", 10_000_000)
        wall, results = await _trajectory_level(st, reqs, ids)
    finally:
        engine.unit_s = unit_s  # type: ignore[attr-defined]
    turns = sum(r.turns for r in results)
    activities = sum(4 + 2 * r.turns for r in results)  # reset, close, score, save + 2 per turn
    out = {
        "trajectories": float(len(results)),
        "wall_s": wall,
        "ceiling_tps": len(results) / wall,
        "activities_per_s": activities / wall,
        "mean_turns": turns / len(results),
    }
    say(
        f"calibration: {len(results)} zero-delay trajectories in {wall:.1f} s -> orchestration ceiling "
        f"{out['ceiling_tps']:.1f} traj/s ({out['activities_per_s']:.0f} activities/s)"
    )
    return out


async def _traj_vs_batch(st: BenchStack, w: Workload, sigma: float, say: Say) -> dict[str, object]:
    traj_s: list[float] = []
    batch_s: list[float] = []
    rounds: list[int] = []
    util: dict[str, list[float]] = {"traj": [], "batch": []}
    for rep in range(w.repeats):
        name = f"tvb-s{w.seed}-sigma{sigma:g}-r{rep}"
        reqs, ids = _episodes(st, w, sigma, name, 20_000_000 + 1000 * rep)
        order = ["traj", "batch"] if rep % 2 == 0 else ["batch", "traj"]
        for mode in order:
            if mode == "traj":
                st.engine.reset_stats()  # type: ignore[attr-defined]
                wall, results = await _trajectory_level(st, reqs, ids)
                failed = [r.error for r in results if r.status.value != "completed"]
                if failed:
                    raise RuntimeError(f"{len(failed)} trajectories did not complete: {failed[:3]}")
                traj_s.append(wall)
                util["traj"].append(st.engine.stats()["utilisation"])  # type: ignore[attr-defined]
            else:
                st.engine.reset_stats()  # type: ignore[attr-defined]
                wall, res = await _batch_level(st, reqs, ids)
                rounds.append(res.rounds)  # type: ignore[attr-defined]
                batch_s.append(wall)
                util["batch"].append(st.engine.stats()["utilisation"])  # type: ignore[attr-defined]
    out: dict[str, object] = {
        "sigma": sigma,
        "traj_tps": w.batch_size / mean(traj_s),
        "batch_tps": w.batch_size / mean(batch_s),
        "ratio": mean(batch_s) / mean(traj_s),
        "traj_s": traj_s,
        "batch_s": batch_s,
        "batch_rounds": rounds,
        "decode_utilisation": {k: mean(v) for k, v in util.items()},
    }
    say(
        f"env σ={sigma:g}: trajectory-level {mean(traj_s):.1f} s, batch-level {mean(batch_s):.1f} s per batch "
        f"of {w.batch_size} -> ratio {out['ratio']:.2f}x"
    )
    return out


async def run_bench(w: Workload, cache_dir: Path, say: Say) -> dict[str, object]:
    started = time.monotonic()
    load_start = os.getloadavg()
    async with embedded_stack(w, cache_dir, say) as st:
        calibration = await _calibrate(st, w, say)
        needed = (
            ideal_bound(w, w.train_fraction * group_latency_units(w, w.env_sigma, w.batch_size, 300)).ideal / w.unit_s
        )
        if needed > 0.5 * calibration["ceiling_tps"] and not w.quick:
            say(
                f"note: the workload's ideal rate (~{needed:.1f} traj/s at {w.unit_s:g} s/unit) needs "
                f"{needed / calibration['ceiling_tps']:.0%} of the orchestration ceiling measured here; above ~50% "
                "Temporal's own latency weighs on the figures (a larger --unit-s lightens it)"
            )
        pilot = await _training_run(st, w, "pilot", 0, PILOT_TRAIN_S, w.pilot_steps, 0, say)
        gen_s = mean(pilot.generation_phases_s)
        train_s = w.train_fraction * gen_s
        say(f"pilot: sync generation phase {gen_s:.1f} s = {gen_s / w.unit_s:.1f} units -> train step {train_s:.2f} s")
        runs: dict[str, RunFigures] = {}
        for alpha in (0, *w.alphas):
            label = "sync" if alpha == 0 else f"alpha{alpha}"
            seed0 = 1_000 * (alpha + 1)
            runs[label] = r = await _training_run(st, w, label, alpha, train_s, w.steps, seed0, say)
            say(
                f"{label}: {w.steps} steps in {r.wall_s:.1f} s -> {r.tps:.2f} traj/s steady "
                f"({r.whole_tps:.2f} whole run), decode utilisation {r.decode_utilisation:.0%}, "
                f"mean staleness {r.staleness_mean:.2f}"
            )
        tvb = {f"{s:g}": await _traj_vs_batch(st, w, s, say) for s in w.sigmas}
    machine = {
        "cpus": os.cpu_count() or 0,
        "loadavg_1m_start": load_start[0],
        "loadavg_1m_end": os.getloadavg()[0],
        "bench_process_cpu_s": time.process_time(),
    }
    return summarize(w, calibration, pilot, gen_s, train_s, runs, tvb, machine, time.monotonic() - started)


def main(w: Workload, json_path: Path | None, cache_dir: Path) -> int:
    t0 = time.monotonic()
    # Trajectories of a finished run are cancelled (and some then log a lost sandbox): expected here, and
    # counted in the report, so only errors are shown.
    logging.getLogger("temporalio").setLevel(logging.ERROR)

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f} s] {msg}", file=sys.stderr, flush=True)

    say(w.describe())
    summary = asyncio.run(run_bench(w, cache_dir, say))
    print(render(summary), flush=True)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(summary, indent=2))
        say(f"wrote {json_path}")
    return 0
