"""The pure parts of `trajflow trajectories list`, `replay` and `status RUN`: the visibility query, the old-vs-new
table, where `--from-failure` resets to, and the status text. No server, no Docker."""

from __future__ import annotations

import pytest
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent

from trajflow.cli.commands.live import format_status
from trajflow.cli.commands.visibility import TrajectoryRow, format_table, trajectory_query
from trajflow.cli.replay.formatting import NoResetPoint, Outcome, find_reset_point, shorten, side_by_side
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.tasks import TaskConfig
from trajflow.contracts.trajectory import TrajectoryRequest, TrajectoryResult, TrajectoryStatus, TurnSummary


def test_query_without_filters_is_every_trajectory() -> None:
    assert trajectory_query() == "WorkflowType = 'TrajectoryWorkflow'"


def test_query_combines_every_filter() -> None:
    q = trajectory_query(
        status="infra_failed", run="run-1", env="game:GuessTheNumber-v0-easy", task="guess", replay_of="t-1"
    )
    assert q == (
        "WorkflowType = 'TrajectoryWorkflow' AND TrajflowStatus = 'infra_failed' AND TrajflowRun = 'run-1' "
        "AND TrajflowEnv = 'game:GuessTheNumber-v0-easy' AND TrajflowTask = 'guess' AND TrajflowReplayOf = 't-1'"
    )


@pytest.mark.parametrize(
    ("status", "clause"),
    [
        ("completed", "TrajflowStatus = 'completed'"),
        ("failed", "TrajflowStatus = 'failed'"),
        # running, and ends the workflow never saw, are Temporal's own status
        ("running", "ExecutionStatus = 'Running'"),
        ("canceled", "ExecutionStatus = 'Canceled'"),
        ("terminated", "ExecutionStatus = 'Terminated'"),
    ],
)
def test_each_status_filter(status: str, clause: str) -> None:
    assert trajectory_query(status=status).endswith(f" AND {clause}")


@pytest.mark.parametrize("bad", [{"status": "lost"}, {"run": "x' OR '1'='1"}, {"env": ""}, {"task": 'a"b'}])
def test_bad_filters_are_refused_not_pasted(bad: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        trajectory_query(**bad)


def test_table_shows_every_column_and_dashes_for_missing() -> None:
    row = TrajectoryRow(
        "t-1", "completed", "game:X", "guess", "run-1", 2, 0.5, 3, 0, "2026-01-01 10:00:00", None, "completed"
    )
    bare = TrajectoryRow(
        "t-2", "running", "game:X", None, None, None, None, None, None, "2026-01-01 10:00:01", "t-1", "running"
    )
    lines = format_table([row, bare]).splitlines()
    assert lines[0].split()[:3] == ["ID", "STATUS", "ENV"]
    assert lines[1].split() == [
        "t-1",
        "completed",
        "game:X",
        "guess",
        "run-1",
        "2",
        "0.5",
        "3",
        "0",
        "2026-01-01",
        "10:00:00",
        "-",
    ]
    assert lines[2].split()[-1] == "t-1" and lines[2].split()[3:8] == ["-"] * 5


def test_a_task_request_carries_the_task_name_and_a_replay_reports_to_nobody() -> None:
    req = TaskConfig(name="guess").request(3, run_id="run-1")
    assert req.task == "guess" and req.report_target() == "run-1"
    replay = req.model_copy(update={"replay_of": "run-1-g000001-0"})
    assert replay.report_target() is None
    assert TrajectoryRequest.model_validate({}).replay_of == ""  # `{}` from the UI still starts a trajectory


def outcome(
    wid: str, status: TrajectoryStatus, actions: list[str], reward: float | None, error: str | None = None
) -> Outcome:
    req = TrajectoryRequest(seed=7)
    turns = [
        TurnSummary(
            action=a,
            observation=f"obs after {a}",
            env_reward=0.0,
            policy_version=0,
            completion_tokens=3,
            decode_pool="p",
        )
        for a in actions
    ]
    result = TrajectoryResult(
        workflow_id=wid, status=status, turns=len(turns), reward=reward, trajectory_uri="file:///x",
        policy_version=0, env_recoveries=1 if error else 0, error=error,
    )  # fmt: skip
    record = TrajectoryRecord(
        workflow_id=wid,
        request=req,
        status=status,
        reward=reward,
        first_observation="Guess a number\nbetween 1 and 10",
        turns=turns,
        context=None,
        env_recoveries=result.env_recoveries,
        error=error,
    )
    return Outcome(wid, "run-" + wid, result, record, seed=7)


def test_side_by_side_marks_what_differs() -> None:
    old = outcome("t-1", TrajectoryStatus.INFRA_FAILED, ["\\boxed{5}"], None, error="env.step: SandboxLost: gone")
    new = outcome("t-1-replay-abc123", TrajectoryStatus.COMPLETED, ["\\boxed{5}", "\\boxed{7}"], 1.0)
    text = side_by_side(old, new)
    rows = {line.split("  ")[0].strip(): line for line in text.splitlines()[1:]}
    assert "≠ infra_failed" in rows["status"] and text.splitlines()[0].split() == ["original", "replay"]
    assert "= 7" in rows["seed"]
    assert "= Guess a number ⏎ between 1 and 10" in rows["first observation"]  # same seed, same start
    assert "= \\boxed{5}" in rows["turn 1 action"]
    assert rows["turn 2 action"].split()[-2:] == ["-", "\\boxed{7}"] and "≠" in rows["turn 2 action"]
    assert "SandboxLost" in rows["error"]


def test_side_by_side_of_a_workflow_that_failed_outright() -> None:
    broken = Outcome("t-2", "r", None, None, failure="failed: boom", seed=1)
    text = side_by_side(broken, outcome("t-3", TrajectoryStatus.COMPLETED, ["a"], 0.0))
    assert "workflow failed" in text and "failed: boom" in text


def test_shorten_keeps_one_line_within_width() -> None:
    assert shorten("a\n\nb", 10) == "a ⏎ b"
    assert shorten("x" * 50, 10) == "x" * 9 + "…"
    assert shorten(None, 5) == "-" and shorten(0.5, 5) == "0.5"


def event(event_id: int, kind: int, **attrs: object) -> HistoryEvent:
    e = HistoryEvent(event_id=event_id, event_type=kind)  # type: ignore[arg-type]
    for name, value in attrs.items():
        getattr(e, name).CopyFrom(value)
    return e


def failure(event_id: int, kind: int, scheduled: int) -> HistoryEvent:
    e = event(event_id, kind)
    if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
        e.activity_task_failed_event_attributes.scheduled_event_id = scheduled
        e.activity_task_failed_event_attributes.failure.message = "sandbox lost"
    elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
        e.activity_task_timed_out_event_attributes.scheduled_event_id = scheduled
    return e


def history_with_failure_at(fail_kind: int) -> list[HistoryEvent]:
    from temporalio.api.common.v1 import ActivityType
    from temporalio.api.history.v1 import ActivityTaskScheduledEventAttributes

    T = EventType
    return [
        event(1, T.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED),
        event(2, T.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED),
        event(3, T.EVENT_TYPE_WORKFLOW_TASK_STARTED),
        event(4, T.EVENT_TYPE_WORKFLOW_TASK_COMPLETED),
        event(
            5,
            T.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
            activity_task_scheduled_event_attributes=ActivityTaskScheduledEventAttributes(
                activity_type=ActivityType(name="env.reset")
            ),
        ),
        event(6, T.EVENT_TYPE_ACTIVITY_TASK_STARTED),
        event(7, T.EVENT_TYPE_ACTIVITY_TASK_COMPLETED),
        event(8, T.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED),
        event(9, T.EVENT_TYPE_WORKFLOW_TASK_STARTED),
        event(10, T.EVENT_TYPE_WORKFLOW_TASK_COMPLETED),
        event(
            11,
            T.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
            activity_task_scheduled_event_attributes=ActivityTaskScheduledEventAttributes(
                activity_type=ActivityType(name="env.step")
            ),
        ),
        event(12, T.EVENT_TYPE_ACTIVITY_TASK_STARTED),
        failure(13, fail_kind, scheduled=11),
        event(14, T.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED),
        event(15, T.EVENT_TYPE_WORKFLOW_TASK_STARTED),
        event(16, T.EVENT_TYPE_WORKFLOW_TASK_COMPLETED),
        event(17, T.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED),
        event(18, T.EVENT_TYPE_ACTIVITY_TASK_FAILED),  # a second failure: not the first
    ]


@pytest.mark.parametrize(
    "kind", [EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED, EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT]
)
def test_reset_point_is_the_workflow_task_before_the_first_failure(kind: int) -> None:
    point = find_reset_point(history_with_failure_at(kind))
    assert (point.event_id, point.failure_event_id) == (10, 13)
    assert point.failure.startswith("env.step ")


def test_a_reset_mark_and_workflow_task_timeouts_are_not_failures() -> None:
    from temporalio.api.history.v1 import WorkflowTaskFailedEventAttributes

    events = history_with_failure_at(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)[:12]
    events[8] = event(9, EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT)
    reset_mark = WorkflowTaskFailedEventAttributes(
        cause=WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW
    )
    events[9] = event(10, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED, workflow_task_failed_event_attributes=reset_mark)
    with pytest.raises(NoResetPoint, match="no failure"):
        find_reset_point(events)


def test_a_failure_before_any_completed_workflow_task_has_no_reset_point() -> None:
    events = history_with_failure_at(EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED)[:3]
    events.append(event(4, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED))
    with pytest.raises(NoResetPoint, match="before the first workflow task"):
        find_reset_point(events)


def test_status_text_of_a_training_run() -> None:
    s = {
        "kind": "training", "workflow_id": "run-1", "execution_status": "running",
        "attributes": {"TrajflowStatus": "training", "TrajflowPolicyVersion": 1},
        "progress": {
            "run_id": "run-1", "version": 1, "steps": 4, "alpha": 1, "running": 2, "buffered": 1,
            "counters": {"started": 6, "completed": 3, "infra_failed": 1}, "elapsed_s": 12.5, "paused": None,
            "last": {"step": 1, "time_s": 10.0, "reward_mean": 0.25, "trajectories": 4, "staleness": {"0": 2, "1": 2},
                     "train_s": 0.3, "metrics": {"loss": 0.123456}, "stale_dropped_total": 0},
        },
        "query_error": None, "trajectories_query": "q",
        "trajectories": [
            {"workflow_id": "run-1-g000002-0", "replay_of": None, "query_error": None,
             "progress": {"env_id": "game:GuessTheNumber-v0-easy", "turn": 1, "max_turns": 4, "sandbox": "sb-1",
                          "host_queue": "hq", "env_recoveries": 0,
                          "last_observation": "At turn 1\nyou guessed 5"}},
            {"workflow_id": "run-1-g000002-1", "replay_of": None, "progress": None, "query_error": "timeout"},
        ],
    }  # fmt: skip
    text = format_status(s)
    assert "training run-1: training (workflow running)" in text
    assert "version 1/4  alpha 1" in text and "buffer 1 completed" in text and "running 2" in text
    assert "infra_failed 1" in text and "paused: no" in text and "loss=0.1235" in text
    assert "over 4 trajectories, staleness 0×2 1×2, train 0.30s" in text
    assert "run-1-g000002-0  turn 1/4  sandbox sb-1  host hq  env failures 0" in text
    assert "last observation: At turn 1 ⏎ you guessed 5" in text
    assert "run-1-g000002-1  (no answer: timeout)" in text


def test_reset_point_of_a_recorded_infra_failed_trajectory() -> None:
    from trajflow.cli.replay.check import HISTORIES_DIR, load_history

    events = load_history(HISTORIES_DIR / "trajectory-infra-failed.json").events
    point = find_reset_point(events)
    failed = next(e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED)
    assert point.failure_event_id == failed.event_id and point.failure.startswith("env.step failed (SandboxLost)")
    before = [e for e in events if e.event_id < failed.event_id]
    assert point.event_id == max(
        e.event_id for e in before if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
