"""`trajflow chaos`: a training run on the embedded stack under injected faults, then the run's own audit.

Faults, in this order, each at its moment (`fault_moments`, spread over all but the run's last `TAIL_STEPS` steps)
and once the one before has recovered:
    decode, env, reward, orchestrator   kill -9 of that worker process, restarted at once (a crash + supervisor)
    temporal                            kill -9 of the Temporal dev server, restarted on the same database
    trainer                             kill -9 as a `trainer.train_step` starts (mid-step), restarted; a kill
                                        that missed (the step finished first) is repeated at the next step
and throughout the run, `--container-kill-rate` (10%) of episodes get their sandbox container killed while the
episode runs. When the run has ended, `trajflow.lab.chaos.audit` counts from Temporal and the store: started, completed,
failed, infra-failed, lost, consumed twice, infra failures scored, steps completed vs configured.

Limits: it needs the stack of `trajflow up` on this machine (it starts it when it is not running) because it
kills and restarts that stack's processes; a fault whose moment never comes (the run ended first) is reported as
not injected, and the run then does not count as a pass.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trajflow.contracts import names
from trajflow.contracts.config import RunConfig
from trajflow.contracts.training import TrainingProgress, TrainingResult, TrainingRunConfig
from trajflow.infra import stack
from trajflow.infra.settings import Settings
from trajflow.infra.temporal import wait_until_reachable
from trajflow.lab.chaos.audit import ChaosCounts, audit, collect
from trajflow.lab.chaos.containers import ContainerKills, kill_sandboxes, sleep_or

Say = Callable[[str], None]
Follow = Callable[[Any, Say], Awaitable[TrainingResult]]
"""Follows a training run's handle to its result, saying its progress, riding out restarts of the stack."""
PROCESS_FAULTS = ("decode", "env", "reward", "orchestrator", "temporal", "trainer")
"""The trainer last: its recovery (a heartbeat timeout, a restart, the step again) is the longest."""
TAIL_STEPS = 2
"""Steps of the run left after the faults' moments: the trainer's fault needs a train step to start after the faults
before it have recovered, and once the rollouts are done a tiny model trains its last steps back to back in a second
or two (a `--quick` run once ended before the trainer's moment when its moments ran to 6/8 of the run)."""
STARTED = 2
"""PendingActivityState STARTED: a worker is running the activity."""


@dataclass
class FaultRecord:
    fault: str
    at_s: float
    """Seconds since the run started."""
    detail: str
    recovered_after_s: float | None = None
    """Until the run moved on after the restart (`recovered`)."""
    step_attempt: int = 0
    """For the trainer: the train step's attempt seen after the kill (>= 2: the kill interrupted it)."""
    kills: int = 1
    """For the trainer: the kills it took to land one mid-step (a step that finished first is killed again)."""


@dataclass
class ChaosReport:
    run_id: str
    config: str
    quick: bool
    counts: ChaosCounts
    faults: list[FaultRecord]
    faults_not_injected: list[str]
    containers: ContainerKills
    wall_s: float
    timeline: list[tuple[float, int, int]]
    """(seconds, trajectories ended, policy version) samples, for the plot."""

    @property
    def ok(self) -> bool:
        return self.counts.ok and not self.faults_not_injected

    def to_json(self) -> dict[str, Any]:
        c = self.counts
        return {
            "run_id": self.run_id,
            "config": self.config,
            "quick": self.quick,
            "ok": self.ok,
            "started": c.started,
            "completed": c.completed,
            "failed": c.failed,
            "infra_failed": c.infra_failed,
            "cancelled": c.cancelled,
            "lost": c.lost,
            "consumed": c.consumed,
            "consumed_twice": c.consumed_twice,
            "infra_failures_scored": c.infra_failures_scored,
            "steps_completed": c.steps_completed,
            "steps_configured": c.steps_configured,
            "goals": c.goals_met,
            "violations": {
                "lost": c.lost_ids,
                "consumed_twice": c.consumed_twice_ids,
                "infra_scored": c.infra_scored_ids,
            },
            "faults": [asdict(f) for f in self.faults],
            "faults_not_injected": self.faults_not_injected,
            "containers": asdict(self.containers),
            "wall_s": round(self.wall_s, 1),
            "timeline": self.timeline,
        }


def chaos_run_config(config: RunConfig, quick: bool) -> TrainingRunConfig:
    """The config's training run; `--quick`: 10 steps of 8 (groups of 4), enough moments for every fault and their
    recoveries (the orchestrator's takes 10-15 s) and `TAIL_STEPS` after them, even where a tiny model's run of 6
    steps ended in 34 s."""
    run = config.training_run()
    if quick:
        run = TrainingRunConfig.model_validate(
            {**run.model_dump(), "steps": 10, "batch_size": 8, "group_size": 4, "redundancy": 0}
        )
    return run


class Chaos:
    def __init__(self, settings: Settings, client, store, run_id: str, run: TrainingRunConfig, say: Say) -> None:
        self.settings, self.client, self.store = settings, client, store
        self.run_id, self.run, self.say = run_id, run, say
        self.handle = client.get_workflow_handle(run_id, result_type=TrainingResult)
        self.t0 = time.monotonic()
        self.faults: list[FaultRecord] = []
        self.before: dict[int, TrainingProgress] = {}
        """Each fault's (by its index in `faults`) progress when it was injected."""
        self.containers = ContainerKills()
        self.timeline: list[tuple[float, int, int]] = []
        self.progress: TrainingProgress | None = None

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    # --- watching -------------------------------------------------------------------------------------------

    async def watch(self, done: asyncio.Event) -> None:
        """Sample the run's progress every second (rides out a restarting server: samples just pause)."""
        while not done.is_set():
            try:
                p = await self.handle.query(names.QUERY_PROGRESS, result_type=TrainingProgress)
                self.progress = p
                self.timeline.append((self.now(), ended(p), p.version))
            except Exception:
                pass
            await sleep_or(done, 1.0)

    async def until(self, predicate: Callable[[TrainingProgress], bool], done: asyncio.Event) -> bool:
        while not done.is_set():
            if self.progress is not None and predicate(self.progress):
                return True
            await sleep_or(done, 0.2)
        return False

    # --- process faults -------------------------------------------------------------------------------------

    async def inject_process_faults(self, done: asyncio.Event) -> list[str]:
        """Each fault at its moment (`fault_moments`) once the one before has recovered; returns those never
        injected."""
        moments = fault_moments(max(1, self.run.steps - TAIL_STEPS) * self.run.batch_size, len(PROCESS_FAULTS))
        for i, (fault, due) in enumerate(zip(PROCESS_FAULTS, moments, strict=True)):
            previous = self.faults[-1] if self.faults else None
            if not await self.until(
                lambda p, d=due, r=previous: ended(p) >= d and (r is None or r.recovered_after_s is not None), done
            ):
                return list(PROCESS_FAULTS[i:])
            if fault == "trainer":
                landed = await self._kill_trainer_mid_step(done)
                if landed is None:
                    return list(PROCESS_FAULTS[i:])
                record, before = landed
            else:
                before = self.progress
                assert before is not None
                at = self.now()
                old, new = await asyncio.to_thread(stack.crash_and_restart, self.settings, fault, self.say)
                if fault == "temporal":
                    await wait_until_reachable(self.settings, timeout_s=120, quiet=True)
                record = FaultRecord(fault, at, f"pid {old.pid} killed -9, restarted as pid {new.pid}")
                self.faults.append(record)
            self.before[len(self.faults) - 1] = before
            asyncio.create_task(self._time_recovery(record, before, done))
            if fault == "trainer" and not record.step_attempt:
                return ["trainer (mid-step)"]
        return []

    async def _kill_trainer_mid_step(self, done: asyncio.Event) -> tuple[FaultRecord, TrainingProgress] | None:
        """kill -9 the trainer as a train step starts, until a kill lands mid-step: the step's retry (attempt >= 2)
        proves it. A tiny model's step can take half a second, and on a loaded machine the step may finish before
        the kill lands; then the next step gets the next kill. Returns the fault (`step_attempt` 0 when the run
        ended before any kill landed) and the progress before it, or None when no step started."""
        record: FaultRecord | None = None
        missed = 0
        while (step := await self._wait_for_train_step(done)) is not None:
            at = self.now()
            old, new = await asyncio.to_thread(stack.crash_and_restart, self.settings, "trainer", self.say)
            before = await self._progress_now()  # no version is published while the trainer is down
            detail = f"pid {old.pid} killed -9, restarted as pid {new.pid} while training v{before.version + 1}"
            if missed:
                detail += f" ({missed} earlier kill(s) missed: the step finished first)"
            if record is None:
                record = FaultRecord("trainer", at, detail)
                self.faults.append(record)
            record.at_s, record.detail, record.kills = at, detail, missed + 1
            record.step_attempt = await self._step_retried(step, done)
            if record.step_attempt:
                record.detail += f"; mid-step confirmed: the step was retried (attempt {record.step_attempt})"
                return record, before
            missed += 1
            self.say(f"trainer kill {missed} missed (the step finished first): killing again as the next step starts")
        if record is not None:
            record.detail += "; the step finished before the kill landed, and no later step was left to kill"
            return record, before
        return None

    async def _progress_now(self) -> TrainingProgress:
        """The run's progress queried now; the last 1-s sample if the query fails."""
        try:
            return await self.handle.query(names.QUERY_PROGRESS, result_type=TrainingProgress)
        except Exception:
            assert self.progress is not None
            return self.progress

    async def _wait_for_train_step(self, done: asyncio.Event) -> str | None:
        """Poll until a train step starts on a trainer worker, and return its activity id at once (so the kill
        lands mid-step); None if the run ended first. A step already running when the wait begins is skipped: it
        may be about to finish, and a tiny model's step takes about a second."""
        running: set[str] | None = None
        while not done.is_set():
            try:
                desc = await self.handle.describe()
                started = {
                    a.activity_id
                    for a in desc.raw_description.pending_activities
                    if a.activity_type.name == names.TRAIN_STEP and a.state == STARTED
                }
                if running is None:
                    running = started
                elif started - running:
                    return min(started - running)
                else:
                    running &= started
            except Exception:
                pass
            await sleep_or(done, 0.1)
        return None

    async def _time_recovery(self, record: FaultRecord, before: TrainingProgress, done: asyncio.Event) -> None:
        if await self.until(lambda p: recovered(record.fault, p, before), done):
            record.recovered_after_s = round(self.now() - record.at_s, 1)

    def finish(self, result: TrainingResult) -> None:
        """The run's end is progress too: a fault its 1-s samples did not see recover before the run ended (late
        in a run, the last step may follow the restart within a second) counts as recovered by the end when the
        final version or trajectory count moved past the fault's."""
        final = TrainingProgress(
            run_id=result.run_id,
            version=result.version,
            steps=self.run.steps,
            alpha=self.run.alpha,
            running=0,
            buffered=0,
            counters=result.counters,
            last=None,
            elapsed_s=result.wall_seconds,
        )
        for i, record in enumerate(self.faults):
            if record.recovered_after_s is None and recovered(record.fault, final, self.before[i]):
                record.recovered_after_s = round(self.now() - record.at_s, 1)
                record.detail += "; recovered by the run's end (the last samples missed it)"

    async def _step_retried(self, activity_id: str, done: asyncio.Event) -> int:
        """Watch the killed train step: its attempt once it shows a second one (proof the kill interrupted it), or
        0 once it is no longer pending without one (it finished before the kill landed) or the run ended."""
        while not done.is_set():
            try:
                pending = [
                    a
                    for a in (await self.handle.describe()).raw_description.pending_activities
                    if a.activity_type.name == names.TRAIN_STEP and a.activity_id == activity_id
                ]
            except Exception:
                pending = None
            if pending == []:
                return 0
            if pending and pending[0].attempt >= 2:
                return pending[0].attempt
            await sleep_or(done, 0.2)
        return 0


def fault_moments(trajectories: int, faults: int) -> list[int]:
    """How many trajectories must have ended before each fault: evenly spread over the first (n + 1) / (n + 2) of
    the run, so the last one (the Temporal server) still leaves a step or more to recover in. Fixed moments, not
    gaps since the fault before, so a slow recovery or a burst of episodes ending at once does not push the later
    faults past the end of the run."""
    return [(i + 1) * trajectories // (faults + 2) for i in range(faults)]


def recovered(fault: str, now: TrainingProgress, before: TrainingProgress) -> bool:
    """Whether the run moved on since the fault: the trainer's, once a new version is published; any other's,
    once a trajectory ended or a version was published (late in a run every episode may have ended already,
    and then only the trainer's next version can show the stack works again)."""
    if fault == "trainer":
        return now.version > before.version
    return ended(now) > ended(before) or now.version > before.version


def ended(p: TrainingProgress) -> int:
    c = p.counters
    return c.completed + c.failed + c.infra_failed


async def run_chaos(
    config: RunConfig,
    config_path: Path,
    settings: Settings,
    say: Say,
    follow: Follow,
    *,
    quick: bool,
    run_id: str,
    kill_rate: float = 0.1,
    seed: int = 0,
    settle_s: float = 180.0,
) -> ChaosReport:
    """Train `config` under faults and audit what it left. `follow` follows the run to its result through the
    faults (`trajflow train`'s own follower, handed over by the CLI: the lab imports nothing of the CLI)."""
    from trajflow.client import start_training
    from trajflow.infra.store import open_store_from

    client = await wait_until_reachable(settings, quiet=True)
    store = open_store_from(settings)
    run = chaos_run_config(config, quick)
    say(
        f"chaos run {run_id}: {run.steps} steps of B={run.batch_size}, alpha={run.alpha}; faults: "
        f"{', '.join(PROCESS_FAULTS)}; {kill_rate:.0%} of episodes lose their sandbox container mid-episode"
    )
    chaos = Chaos(settings, client, store, run_id, run, say)
    await start_training(run, run_id=run_id, client=client)
    done = asyncio.Event()
    watcher = asyncio.create_task(chaos.watch(done))
    killer = asyncio.create_task(
        kill_sandboxes(client, run_id, chaos.containers, done, kill_rate=kill_rate, rng=random.Random(seed))
    )
    faults = asyncio.create_task(chaos.inject_process_faults(done))
    result = await follow(chaos.handle, say)
    done.set()
    chaos.finish(result)
    not_injected = await faults
    await asyncio.gather(watcher, killer)
    await _settle(client, run_id, settle_s, say)
    records = await collect(client, store, run_id, result.version, run.steps, result.counters.started)
    return ChaosReport(
        run_id=run_id,
        config=str(config_path),
        quick=quick,
        counts=audit(records),
        faults=chaos.faults,
        faults_not_injected=not_injected,
        containers=chaos.containers,
        wall_s=time.monotonic() - chaos.t0,
        timeline=chaos.timeline,
    )


async def _settle(client, run_id: str, timeout_s: float, say: Say) -> None:
    """Wait for the run's leftover trajectories (cancelled at its end) to close; what still runs then is lost."""
    query = f"{names.SA_RUN} = '{run_id}' AND ExecutionStatus = 'Running'"
    deadline = time.monotonic() + timeout_s
    while True:
        n = await client.count_workflows(query)
        if n.count == 0 or time.monotonic() > deadline:
            if n.count:
                say(f"{n.count} trajectories of {run_id} still running {timeout_s:.0f}s after the run ended")
            return
        await asyncio.sleep(1.0)
