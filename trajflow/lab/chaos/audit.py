"""The chaos run's verdict, from the run's own records: Temporal visibility (every trajectory of the run and its
recorded status and reward), the training workflow's histories (what each optimizer step was given: its refs, and a
sharded step's group manifests, read as the trainer reads them) and the trajectory records in the object store.

    lost            started but neither completed nor failed: still running after the run ended, terminated,
                    timed out, failed as a workflow, closed without a recorded status, or counted as started by
                    the training workflow yet absent from visibility
    consumed twice  one trajectory in more than one optimizer step (or twice in one)
    infra scored    an infra-failed trajectory that carries a reward, or any trajectory trained on whose stored
                    record is not `completed` with the reward the step was given

`audit` is pure (tested on hand-made records); `collect` reads the records of a finished run.
Limits: a run's trajectories are found by the `TrajflowRun` search attribute, so one started outside the
run with its id counts as the run's (chaos starts none).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from pydantic import BaseModel

from trajflow.contracts import names
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.training import TrainRef, TrainStepInput

FINAL = ("completed", "failed", "infra_failed")
SHOWN = 20
"""Ids listed per kind of violation (the counts are complete)."""


@dataclass(frozen=True)
class TrajectoryRow:
    """One trajectory workflow as visibility shows it."""

    workflow_id: str
    execution: str
    """Temporal's execution status, as `trajflow trajectories list` shows it: running, completed, canceled,
    terminated, failed, timed_out."""
    status: str | None
    """The `TrajflowStatus` search attribute: the trajectory's recorded outcome."""
    reward: float | None
    """The `TrajflowReward` search attribute: set only when the trajectory was scored."""


@dataclass(frozen=True)
class StoredOutcome:
    """What the store's record of a trained-on trajectory says (None when it cannot be read)."""

    status: str | None
    reward: float | None


@dataclass
class RunRecords:
    trajectories: list[TrajectoryRow]
    started_by_run: int
    """The training workflow's own `started` counter."""
    batches: list[list[TrainRef]]
    """What each `trainer.train_step` the training workflow scheduled was given, in order."""
    stored: dict[str, StoredOutcome] = field(default_factory=dict)
    """Store records of every trajectory trained on, by workflow id."""
    steps_completed: int = 0
    steps_configured: int = 0


class ChaosCounts(BaseModel):
    started: int
    completed: int
    failed: int
    infra_failed: int
    cancelled: int
    """Cancelled by the training workflow on purpose (redundant samples, leftovers at the end): not lost."""
    lost: int
    consumed: int
    consumed_twice: int
    infra_failures_scored: int
    steps_completed: int
    steps_configured: int
    lost_ids: list[str]
    consumed_twice_ids: list[str]
    infra_scored_ids: list[str]

    @property
    def goals_met(self) -> dict[str, bool]:
        return {
            "0 lost": self.lost == 0,
            "0 consumed twice": self.consumed_twice == 0,
            "0 infra failures scored": self.infra_failures_scored == 0,
            "all steps completed": self.steps_completed == self.steps_configured,
        }

    @property
    def ok(self) -> bool:
        return all(self.goals_met.values())


def audit(records: RunRecords) -> ChaosCounts:
    outcome: dict[str, str] = {}
    lost: list[str] = []
    scored: list[str] = []
    for row in records.trajectories:
        if row.execution == "canceled":
            outcome[row.workflow_id] = "cancelled"
        elif row.execution == "completed" and row.status in FINAL:
            outcome[row.workflow_id] = row.status
            if row.status == "infra_failed" and row.reward is not None:
                scored.append(row.workflow_id)
        else:
            lost.append(row.workflow_id)
    missing = max(0, records.started_by_run - len(records.trajectories))
    """Started (by the training workflow's count) but not even in visibility: lost, without an id to show."""

    refs = [ref for batch in records.batches for ref in batch]
    seen = Counter(ref.workflow_id for ref in refs)
    twice = sorted(wid for wid, n in seen.items() if n > 1)
    for ref in refs:
        stored = records.stored.get(ref.workflow_id)
        ok = stored is not None and stored.status == "completed" and stored.reward == ref.reward
        if not ok or outcome.get(ref.workflow_id) != "completed":
            scored.append(ref.workflow_id)
    scored = sorted(set(scored))
    counts = Counter(outcome.values())
    return ChaosCounts(
        started=max(len(records.trajectories), records.started_by_run),
        completed=counts["completed"],
        failed=counts["failed"],
        infra_failed=counts["infra_failed"],
        cancelled=counts["cancelled"],
        lost=len(lost) + missing,
        consumed=len(refs),
        consumed_twice=len(twice),
        infra_failures_scored=len(scored),
        steps_completed=records.steps_completed,
        steps_configured=records.steps_configured,
        lost_ids=lost[:SHOWN],
        consumed_twice_ids=twice[:SHOWN],
        infra_scored_ids=scored[:SHOWN],
    )


async def collect(client, store, run_id: str, steps_completed: int, steps_configured: int, started: int) -> RunRecords:
    """Read a finished run's records: visibility, every execution's history of the training workflow, the store."""
    import asyncio

    from trajflow.activities.batches import step_refs

    # The raw search attributes, not `visibility.row_of`: that one shows a cancelled trajectory's execution status
    # in place of its recorded one, and here a closed trajectory without a recorded outcome must count as lost.
    rows = []
    query = f"WorkflowType = '{names.TRAJECTORY_WORKFLOW}' AND {names.SA_RUN} = '{run_id}'"
    async for wf in client.list_workflows(query):
        sa = wf.search_attributes
        rows.append(
            TrajectoryRow(
                workflow_id=wf.id,
                execution=wf.status.name.lower() if wf.status else "unknown",
                status=(sa.get(names.SA_STATUS) or [None])[0],
                reward=(sa.get(names.SA_REWARD) or [None])[0],
            )
        )
    batches = []
    async for execution in client.list_workflows(f"WorkflowId = '{run_id}'"):
        history = await client.get_workflow_handle(run_id, run_id=execution.run_id).fetch_history()
        for event in history.events:
            if not event.HasField("activity_task_scheduled_event_attributes"):
                continue
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name != names.TRAIN_STEP:
                continue
            (inp,) = await client.data_converter.decode(attrs.input.payloads, [TrainStepInput])
            if any(given == inp for _, _, given, _ in batches):
                # a step in flight when the workflow continued as new is issued again, the same input: the trainer
                # trains a version once (an input of the same version that differs is kept, and audited as trained)
                continue
            # a sharded step names its groups by range; the trainer's own reader gives the refs it trained on
            refs = await asyncio.to_thread(step_refs, store, inp)
            batches.append((inp.version, event.event_time.ToDatetime(), inp, refs))
    batches.sort(key=lambda b: (b[0], b[1]))

    def read(ref: TrainRef) -> tuple[str, StoredOutcome]:
        try:
            rec = TrajectoryRecord.model_validate(store.get_json(ref.trajectory_uri))
        except Exception:
            return ref.workflow_id, StoredOutcome(status=None, reward=None)
        return ref.workflow_id, StoredOutcome(status=rec.status.value, reward=rec.reward)

    refs = [ref for _, _, _, batch in batches for ref in batch]
    stored = dict(await asyncio.gather(*(asyncio.to_thread(read, ref) for ref in refs)))
    return RunRecords(
        trajectories=rows,
        started_by_run=started,
        batches=[batch for _, _, _, batch in batches],
        stored=stored,
        steps_completed=steps_completed,
        steps_configured=steps_configured,
    )
