"""The audit of `trajflow bench soak --scale` (a sharded run), and what it reads from Temporal: the training workflow's
histories (every run of it, through continue-as-new) and visibility (its trajectories and shards by status).

From the histories (`run_history`): each train step's input as issued (a step issued again after a continue-as-new
must carry the same groups), the signals received between two steps (group reports, shard ends), the bytes of each
continue-as-new input (the state carried over) and each run's events. The audit (`audit_sharded`) then checks that
the run trained versions 1..steps, B samples a step on B/n groups, no group twice and every group it admitted, that
visibility holds every trajectory it started and its shards, and that none of them is left running.

Not covered: the contents of the manifests (the trainer reads them: a missing one fails the step) and of the records.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

from temporalio.client import Client

from trajflow.contracts import names
from trajflow.contracts.training import TrainingResult, TrainingState, TrainStepInput


@dataclass
class RunHistory:
    runs: list[str] = field(default_factory=list)
    """The run ids of the training workflow, first to last (the newest as "")."""
    steps: dict[int, TrainStepInput] = field(default_factory=dict)
    """Version before the step -> its input."""
    reissued_differently: list[int] = field(default_factory=list)
    signals_per_step: list[dict[str, int]] = field(default_factory=list)
    """Signal name -> count, received before step 1 completed, then between steps; the last: after the last step."""
    continue_bytes: list[int] = field(default_factory=list)
    """The bytes of each continue-as-new input (`TrainingStart`: the config and the whole state)."""
    events: list[int] = field(default_factory=list)
    """Events of each run's history."""


async def run_history(client: Client, run_id: str) -> RunHistory:
    """Walk every run of the training workflow `run_id`, oldest first: found from the newest back through each run's
    `continued_execution_run_id` (visibility's list of runs may lag)."""
    out = RunHistory()
    chain: list[tuple[str, list]] = []
    run: str | None = None  # None: the newest run
    while True:
        events = [ev async for ev in client.get_workflow_handle(run_id, run_id=run).fetch_history_events()]
        started = events[0].workflow_execution_started_event_attributes
        chain.append((run or "", events))
        if not started.continued_execution_run_id:
            break
        run = started.continued_execution_run_id
    signals: Counter[str] = Counter()
    for run, events in reversed(chain):
        out.runs.append(run)
        train_steps: set[int] = set()  # scheduled event ids of this run's train steps
        for ev in events:
            if ev.HasField("workflow_execution_signaled_event_attributes"):
                signals[ev.workflow_execution_signaled_event_attributes.signal_name] += 1
            elif ev.HasField("activity_task_scheduled_event_attributes"):
                attrs = ev.activity_task_scheduled_event_attributes
                if attrs.activity_type.name == names.TRAIN_STEP:
                    step = TrainStepInput.model_validate_json(attrs.input.payloads[0].data)
                    if out.steps.setdefault(step.version, step) != step:
                        out.reissued_differently.append(step.version)
                    train_steps.add(ev.event_id)
            elif ev.HasField("activity_task_completed_event_attributes"):
                if ev.activity_task_completed_event_attributes.scheduled_event_id in train_steps:
                    out.signals_per_step.append(dict(signals))
                    signals = Counter()
            elif ev.HasField("workflow_execution_continued_as_new_event_attributes"):
                payloads = ev.workflow_execution_continued_as_new_event_attributes.input.payloads
                out.continue_bytes.append(sum(len(p.data) for p in payloads))
        out.events.append(len(events))
    out.signals_per_step.append(dict(signals))
    return out


@dataclass
class Closed:
    trajectories: dict[str, int]
    """The run's TrajectoryWorkflows by status, from visibility."""
    shard_status: dict[str, int]

    @property
    def shards_total(self) -> int:
        return sum(self.shard_status.values())

    @property
    def running(self) -> int:
        return self.trajectories.get("RUNNING", 0) + self.shard_status.get("RUNNING", 0)


async def by_status(client: Client, query: str) -> dict[str, int]:
    counts: Counter[str] = Counter()
    async for wf in client.list_workflows(query):
        counts[wf.status.name if wf.status is not None else "UNKNOWN"] += 1
    return dict(counts)


async def wait_closed(client: Client, run_id: str, started: int, timeout_s: float) -> Closed:
    """The run's trajectories and shards by status, once none runs and visibility lists the `started` trajectories
    (or as they are after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        closed = Closed(
            await by_status(client, f"WorkflowType = '{names.TRAJECTORY_WORKFLOW}' AND TrajflowRun = '{run_id}'"),
            await by_status(client, f"WorkflowType = '{names.SHARD_WORKFLOW}' AND TrajflowRun = '{run_id}'"),
        )
        done = not closed.running and sum(closed.trajectories.values()) == started
        if done or time.monotonic() > deadline:
            return closed
        await asyncio.sleep(1.0)


def audit_sharded(
    result: TrainingResult, state: TrainingState, history: RunHistory, closed: Closed, steps: int, batch: int, n: int
) -> list[str]:
    """What does not add up in a sharded run (empty: nothing lost, nothing trained twice)."""
    c, problems = result.counters, []
    if result.version != steps or [h.step for h in result.history] != list(range(1, steps + 1)):
        problems.append(f"the run ended at version {result.version}, steps {[h.step for h in result.history]}")
    short = [h.step for h in result.history if h.trajectories != batch]
    if short:
        problems.append(f"steps {short} trained on other than B = {batch} samples")
    if sorted(history.steps) != list(range(steps)):
        problems.append(f"train steps issued from versions {sorted(history.steps)}, not 0..{steps - 1}")
    if history.reissued_differently:
        problems.append(f"steps from versions {history.reissued_differently} issued again with other groups")
    trained = [k for s in history.steps.values() for start, end in s.groups for k in range(start, end)]
    per_step = {v: sum(end - start for start, end in s.groups) for v, s in history.steps.items()}
    if any(s.refs for s in history.steps.values()) or set(per_step.values()) - {batch // n}:
        problems.append(f"groups a step {per_step}, refs in a step's input: not B/n = {batch // n} groups each")
    twice = sorted(k for k, times in Counter(trained).items() if times > 1)
    if twice:
        problems.append(f"groups {twice[:10]} trained more than once")
    admitted = state.next_group
    never = sorted(set(range(admitted)) - set(trained))
    if never and c.groups_abandoned + c.dropped_stale // n + c.flat_groups_dropped < len(never):
        problems.append(
            f"{len(never)} groups admitted and never trained (first {never[:10]}), none dropped or abandoned"
        )
    sharded = state.sharded
    if sharded is None or sharded.open or sharded.ready or sharded.shards:
        problems.append(f"the run ended sharded state {sharded}: groups or shards left open")
    if set(closed.shard_status) - {"COMPLETED"}:
        problems.append(f"shards by status {closed.shard_status}: not every one completed")
    if sum(closed.trajectories.values()) != c.started:
        problems.append(
            f"visibility holds {sum(closed.trajectories.values())} of the run's trajectories, it started {c.started}"
        )
    ended = c.completed + c.failed + c.infra_failed + c.cancelled
    if ended != c.started or closed.running:
        problems.append(
            f"started {c.started} != completed {c.completed} + failed {c.failed} + infra-failed {c.infra_failed} + "
            f"cancelled {c.cancelled}; still running: {closed.running} trajectories and shards"
        )
    if c.failed or c.infra_failed or c.groups_abandoned:
        problems.append(
            f"{c.failed} failed, {c.infra_failed} infra-failed trajectories and {c.groups_abandoned} abandoned groups "
            "on an env that never fails"
        )
    if c.consumed != steps * batch:
        problems.append(f"{c.consumed} samples trained on, {steps} steps of B = {batch} need {steps * batch}")
    return problems
