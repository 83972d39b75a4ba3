"""`trajflow bench soak`: one training run of several hundred steps on the embedded bench stack (simulated engine,
synthetic env, simulated trainer; `trajflow.lab.bench.stack`), continuing as new many times, audited for loss at the
end.

The run's history is kept short on purpose (`history_events_before_continue`), so the TrainingWorkflow continues
as new every few steps and carries its whole state (groups, buffer, counters, running children) across each.
The audit, from the run's own result and from Temporal visibility:
- the run ended at version `steps`, the steps it kept a record of (its last ones) in order, each training B samples,
  and B · steps samples were trained on in all;
- every trajectory the run started is one of its TrajectoryWorkflows in visibility (none unknown, none twice),
  and ended as completed, failed, infra-failed or cancelled (a redundant sample), or still runs at the end;
- none failed (the synthetic env never fails), and every completed sample was trained on, dropped as stale,
  reported late, or still buffered at the end.

Not covered: faults (that is `trajflow chaos`), real models and sandboxes.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from trajflow.lab.bench.stack import BenchStack, embedded_stack
from trajflow.lab.bench.workload import Workload

Say = Callable[[str], None]


@dataclass(frozen=True)
class SoakWorkload:
    steps: int = 300
    batch_size: int = 8
    group_size: int = 4
    alpha: int = 1
    turns: int = 2
    turn_s: float = 0.05
    """Seconds of one decode and of one env step (both sleep)."""
    train_s: float = 0.05
    history_events: int = 600
    """The training workflow continues as new once its history holds this many events."""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.batch_size % self.group_size:
            raise ValueError(
                f"need steps >= 1 and a batch of whole groups, got {self.steps} steps of {self.batch_size}"
            )


def quick_soak(**fields: object) -> SoakWorkload:
    """The CI run (~2 min): 60 steps, continuing as new every few steps."""
    return replace(SoakWorkload(steps=60, batch_size=4, group_size=2, history_events=300), **fields)


def audit(result, steps: int, batch: int, visible: dict[str, int], running: int) -> list[str]:
    """What does not add up (empty: nothing lost). `visible`: the run's TrajectoryWorkflows by execution
    status, from visibility; `running`: how many of them still run."""
    c = result.counters
    problems = []
    kept = [h.step for h in result.history]  # the run keeps the records of its last steps only
    if result.version != steps or kept != list(range(steps - len(kept) + 1, steps + 1)):
        problems.append(
            f"the run ended at version {result.version}, its last steps {kept[-5:]}: not 1..{steps} once each"
        )
    short = [h.step for h in result.history if h.trajectories != batch]
    if short:
        problems.append(f"steps {short[:10]} trained on other than B = {batch} samples")
    if sum(visible.values()) != c.started:
        problems.append(
            f"visibility holds {sum(visible.values())} of the run's trajectories, the run started {c.started}"
        )
    ended = c.completed + c.failed + c.infra_failed + c.cancelled
    if ended + running != c.started:
        problems.append(
            f"started {c.started} != completed {c.completed} + failed {c.failed} + infra-failed {c.infra_failed} "
            f"+ cancelled {c.cancelled} + still running {running}"
        )
    if c.failed or c.infra_failed:
        problems.append(f"{c.failed} failed and {c.infra_failed} infra-failed trajectories on an env that never fails")
    if c.consumed != steps * batch:
        problems.append(f"{c.consumed} samples trained on, {steps} steps of B = {batch} need {steps * batch}")
    return problems


async def run_trajectories(st: BenchStack, run_id: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    async for wf in st.client.list_workflows(f"WorkflowType = 'TrajectoryWorkflow' AND TrajflowRun = '{run_id}'"):
        name = wf.status.name if wf.status is not None else "UNKNOWN"
        counts[name] = counts.get(name, 0) + 1
    return counts


async def _soak(st: BenchStack, sw: SoakWorkload, say: Say) -> dict:
    from trajflow.client import start_training, training_progress
    from trajflow.contracts.tasks import TaskConfig
    from trajflow.contracts.training import TrainingRunConfig
    from trajflow.contracts.trajectory import SamplingParams, StagePools
    from trajflow.lab.bench.synthetic_env import ENV_ID, SyntheticSpec

    spec = SyntheticSpec(mean=1.0, sigma=0.2, min_turns=sw.turns, max_turns=sw.turns)
    task = TaskConfig(
        name="synthetic",
        env_id=ENV_ID,
        env_kwargs=spec.as_kwargs(),
        max_turns=sw.turns,
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
        history_events_before_continue=sw.history_events,
        tasks=[task],
    )
    run_id = f"soak-{uuid.uuid4().hex[:6]}"
    st.trainer.set_step_s(run_id, sw.train_s)  # type: ignore[attr-defined]
    t0 = time.monotonic()
    handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)
    waiter = asyncio.ensure_future(handle.result())
    shown = 0
    while not waiter.done():
        await asyncio.wait({waiter}, timeout=5.0)
        if not waiter.done():
            version = (await training_progress(handle)).version
            if version >= shown + max(1, sw.steps // 10):
                shown = version
                say(f"soak: step {version}/{sw.steps} at {time.monotonic() - t0:.0f} s")
    result = waiter.result()
    wall = time.monotonic() - t0
    runs = [wf.run_id async for wf in st.client.list_workflows(f"WorkflowId = '{run_id}'")]
    visible = await run_trajectories(st, run_id)
    running = visible.get("RUNNING", 0)
    problems = audit(result, sw.steps, sw.batch_size, visible, running)
    figures = {
        "run_id": run_id,
        "steps": result.version,
        "steps_recorded": len(result.history),
        "continued_as_new": len(runs) - 1,
        "wall_s": round(wall, 1),
        "counters": result.counters.model_dump(),
        "trajectories_by_status": visible,
        "lost": problems,
    }
    say(
        f"soak: {figures['steps']} steps in {wall:.0f} s, continued as new {figures['continued_as_new']} times, "
        f"{result.counters.started} trajectories started; "
        + ("nothing lost" if not problems else "LOST: " + "; ".join(problems))
    )
    return figures


async def run(sw: SoakWorkload, cache_dir: Path, say: Say) -> dict:
    w = Workload(batch_size=sw.batch_size, group_size=sw.group_size, slots=256, unit_s=sw.turn_s, decode_sigma=0.2)
    async with embedded_stack(w, cache_dir, say) as st:
        return {"workload": asdict(sw), **await _soak(st, sw, say)}


def main(sw: SoakWorkload, json_path: Path | None, cache_dir: Path, say: Say) -> int:
    figures = asyncio.run(run(sw, cache_dir, say))
    if json_path is not None:
        json_path.write_text(json.dumps(figures, indent=2) + "\n")
        say(f"wrote {json_path}")
    return 1 if figures["lost"] else 0
