"""The chaos verdict (`trajflow.lab.chaos.audit.audit`) on hand-made records: it passes a clean run and catches each
kind of violation it exists to catch, so a chaos run that reports 0 lost means the check could have said more.
Also when a fault counts as recovered from (`trajflow.lab.chaos.harness.recovered`), when each is due (`fault_moments`),
and that a trainer kill which missed its step is repeated at the next step."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from trajflow.contracts import names
from trajflow.contracts.training import TrainingCounters, TrainingProgress, TrainingResult, TrainingRunConfig, TrainRef
from trajflow.lab.chaos.audit import RunRecords, StoredOutcome, TrajectoryRow, audit
from trajflow.lab.chaos.harness import Chaos, FaultRecord, fault_moments, recovered


def row(
    wid: str, execution: str = "completed", status: str | None = "completed", reward: float | None = 1.0
) -> TrajectoryRow:
    return TrajectoryRow(workflow_id=wid, execution=execution, status=status, reward=reward)


def ref(wid: str, reward: float = 1.0) -> TrainRef:
    return TrainRef(
        workflow_id=wid, trajectory_uri=f"file:///s/{wid}.json", group="g0", reward=reward, policy_version=0
    )


def clean() -> RunRecords:
    rows = [
        row("a"),
        row("b", reward=0.0),
        row("c", status="infra_failed", reward=None),
        row("d", "canceled", "running", None),
    ]
    return RunRecords(
        trajectories=rows,
        started_by_run=4,
        batches=[[ref("a"), ref("b", 0.0)]],
        stored={"a": StoredOutcome("completed", 1.0), "b": StoredOutcome("completed", 0.0)},
        steps_completed=1,
        steps_configured=1,
    )


def test_a_clean_run_passes_with_every_count() -> None:
    c = audit(clean())
    assert (c.started, c.completed, c.failed, c.infra_failed, c.cancelled) == (4, 2, 0, 1, 1)
    assert (c.lost, c.consumed, c.consumed_twice, c.infra_failures_scored) == (0, 2, 0, 0)
    assert c.ok


def test_lost_trajectories_are_caught() -> None:
    r = clean()
    r.trajectories += [
        row("still-running", "running", "running", None),
        row("terminated", "terminated", "running", None),
        row("no-outcome", "completed", "running", None),
    ]
    r.started_by_run = 9  # two more than visibility shows
    c = audit(r)
    assert c.lost == 5
    assert set(c.lost_ids) == {"still-running", "terminated", "no-outcome"}
    assert c.goals_met["0 lost"] is False and not c.ok


def test_a_trajectory_in_two_steps_is_consumed_twice() -> None:
    r = clean()
    r.batches.append([ref("a")])
    c = audit(r)
    assert c.consumed == 3 and c.consumed_twice == 1 and c.consumed_twice_ids == ["a"]
    assert not c.ok


def test_scored_or_trained_infra_failures_are_caught() -> None:
    r = clean()
    r.trajectories.append(row("scored-infra", status="infra_failed", reward=0.0))
    r.trajectories.append(row("trained-infra", status="infra_failed", reward=None))
    r.batches.append([ref("trained-infra", 0.0)])
    r.stored["trained-infra"] = StoredOutcome("infra_failed", None)
    c = audit(r)
    assert set(c.infra_scored_ids) == {"scored-infra", "trained-infra"}
    assert c.infra_failures_scored == 2 and not c.ok


def test_a_trained_reward_that_differs_from_the_record_is_caught() -> None:
    r = clean()
    r.stored["a"] = StoredOutcome("completed", 0.0)  # the step was given 1.0
    assert audit(r).infra_scored_ids == ["a"]


def test_missing_steps_fail_the_run() -> None:
    r = clean()
    r.steps_configured = 3
    c = audit(r)
    assert c.goals_met["all steps completed"] is False and not c.ok


def progress(version: int, completed: int) -> TrainingProgress:
    return TrainingProgress(
        run_id="r",
        version=version,
        steps=6,
        alpha=1,
        running=0,
        buffered=0,
        counters=TrainingCounters(completed=completed),
        last=None,
        elapsed_s=0.0,
    )


def test_a_fault_late_in_a_run_recovers_on_the_next_version() -> None:
    before = progress(version=4, completed=52)
    assert not recovered("temporal", progress(4, 52), before)
    assert recovered("temporal", progress(5, 52), before), "every episode had ended: a new version is the progress"
    assert recovered("decode", progress(4, 53), before)
    assert not recovered("trainer", progress(4, 53), before), "the trainer recovers only by publishing"
    assert recovered("trainer", progress(5, 52), before)


def test_every_fault_is_due_well_before_the_run_ends() -> None:
    moments = fault_moments(trajectories=48, faults=6)  # faults spread over 6 steps of 8
    assert moments == [6, 12, 18, 24, 30, 36]
    assert moments[-1] <= 48 - 8, "the Temporal fault leaves at least a step of episodes to recover in"
    assert fault_moments(trajectories=3, faults=6) == [0, 0, 1, 1, 1, 2]


class _Client:
    def get_workflow_handle(self, run_id: str, result_type: object) -> None:
        return None


def test_the_runs_end_counts_as_recovery_when_it_moved_past_the_fault() -> None:
    run = TrainingRunConfig.model_validate({"steps": 6, "batch_size": 8, "group_size": 4})
    chaos = Chaos(None, _Client(), None, "r", run, print)  # type: ignore[arg-type]
    chaos.faults = [FaultRecord("temporal", 80.0, "killed"), FaultRecord("decode", 85.0, "killed")]
    chaos.before = {0: progress(version=5, completed=48), 1: progress(version=6, completed=48)}
    result = TrainingResult(
        run_id="r", version=6, counters=TrainingCounters(completed=48), history=[], wall_seconds=90.0
    )
    chaos.finish(result)
    assert chaos.faults[0].recovered_after_s is not None, "v6 was published after the server came back"
    assert "by the run's end" in chaos.faults[0].detail
    assert chaos.faults[1].recovered_after_s is None, "nothing moved after this one: not a recovery"


class _ScriptedRun:
    """A training run's handle whose `describe` shows the pending train steps a script lists, one entry a call
    (the last repeats)."""

    def __init__(self, script: list[list[tuple[str, int]]]) -> None:
        self.script = script

    async def describe(self) -> SimpleNamespace:
        pending = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        activities = [
            SimpleNamespace(activity_type=SimpleNamespace(name=names.TRAIN_STEP), activity_id=i, attempt=n, state=2)
            for i, n in pending
        ]
        return SimpleNamespace(raw_description=SimpleNamespace(pending_activities=activities))


def test_a_trainer_kill_that_missed_its_step_is_repeated_at_the_next_step(monkeypatch: pytest.MonkeyPatch) -> None:
    from trajflow.infra import stack

    kills: list[str] = []

    def crash_and_restart(settings: object, name: str, say: object) -> tuple[SimpleNamespace, SimpleNamespace]:
        kills.append(name)
        return SimpleNamespace(pid=len(kills)), SimpleNamespace(pid=100 + len(kills))

    monkeypatch.setattr(stack, "crash_and_restart", crash_and_restart)
    run = TrainingRunConfig.model_validate({"steps": 6, "batch_size": 8, "group_size": 4})
    chaos = Chaos(None, _Client(), None, "r", run, print)  # type: ignore[arg-type]
    chaos.progress = progress(version=4, completed=40)
    chaos.handle = _ScriptedRun(
        [
            [],  # nothing running when the wait begins
            [("5", 1)],  # step 5 starts: killed
            [],  # ... but it had finished: a miss
            [],
            [("6", 1)],  # step 6 starts: killed again
            [("6", 1)],  # the heartbeat has not timed out yet
            [("6", 2)],  # retried: the kill landed mid-step
        ]
    )
    landed = asyncio.run(chaos._kill_trainer_mid_step(asyncio.Event()))
    assert landed is not None
    record, _ = landed
    assert kills == ["trainer", "trainer"]
    assert (record.kills, record.step_attempt) == (2, 2)
    assert chaos.faults == [record], "one fault, however many kills it took"
    assert "1 earlier kill(s) missed" in record.detail and "retried (attempt 2)" in record.detail


def test_a_run_that_ends_before_a_kill_lands_reports_the_miss(monkeypatch: pytest.MonkeyPatch) -> None:
    from trajflow.infra import stack

    monkeypatch.setattr(stack, "crash_and_restart", lambda *_: (SimpleNamespace(pid=1), SimpleNamespace(pid=2)))
    run = TrainingRunConfig.model_validate({"steps": 6, "batch_size": 8, "group_size": 4})
    chaos = Chaos(None, _Client(), None, "r", run, print)  # type: ignore[arg-type]
    chaos.progress = progress(version=5, completed=48)
    chaos.handle = _ScriptedRun([[], [("6", 1)], []])  # the last step starts, finishes before the kill, no more

    async def until_the_run_ends() -> tuple[FaultRecord, TrainingProgress] | None:
        done = asyncio.Event()
        asyncio.get_running_loop().call_later(1.0, done.set)
        return await chaos._kill_trainer_mid_step(done)

    landed = asyncio.run(until_the_run_ends())
    assert landed is not None
    assert landed[0].step_attempt == 0 and "no later step was left" in landed[0].detail
