"""The pure parts of `trajflow replay`: an ended trajectory as replay shows it, the old-vs-new table, and where in
a history `--from-failure` resets to. No I/O: the history events and records come in as arguments.

The reset point is the last WorkflowTaskCompleted before the history's first failure (an activity that failed
or timed out past its retries, a failed workflow task, the workflow failing, timing out or being terminated):
resetting there makes the workflow run that task again, i.e. issue again what then failed, with the workflow's
state (turns, actions, recoveries spent) as it was before the failure.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from temporalio.api.enums.v1 import EventType, TimeoutType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent

from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.trajectory import TrajectoryResult


@dataclass(frozen=True)
class Outcome:
    """One run of a trajectory as it ended: its result (None when the workflow itself failed) and its record."""

    workflow_id: str
    run_id: str
    result: TrajectoryResult | None
    record: TrajectoryRecord | None
    failure: str | None = None
    """Why the workflow failed outright (no TrajectoryResult), e.g. a workflow bug or a termination."""
    seed: int | None = None

    @property
    def status(self) -> str:
        return self.result.status.value if self.result else "workflow failed"

    def summary(self) -> dict[str, object]:
        r = self.result
        return {
            "workflow_id": self.workflow_id,
            "run_id": self.run_id,
            "status": self.status,
            "reward": r.reward if r else None,
            "turns": r.turns if r else None,
            "env_failures": r.env_recoveries if r else None,
            "policy_version": r.policy_version if r else None,
            "seed": self.seed,
            "error": (r.error if r else self.failure),
            "trajectory_uri": r.trajectory_uri if r else None,
            "first_observation": self.record.first_observation if self.record else None,
            "actions": [t.action for t in self.record.turns] if self.record else [],
            "observations": [t.observation for t in self.record.turns] if self.record else [],
        }


def shorten(text: object, width: int) -> str:
    """One line of at most `width` characters (newlines shown as ⏎, the cut marked with …)."""
    s = "-" if text is None or text == "" else (f"{text:g}" if isinstance(text, float) else str(text))
    s = " ⏎ ".join(line.strip() for line in s.strip().splitlines() if line.strip()) or s
    s = "".join(c if c.isprintable() else " " for c in s)  # a random policy writes tabs and control bytes
    return s if len(s) <= width else s[: width - 1] + "…"


def side_by_side(old: Outcome, new: Outcome, titles: tuple[str, str] = ("original", "replay"), width: int = 48) -> str:
    """Two columns, old and new, with `=`/`≠` between them: scalars first, then each turn's action and observation."""
    a, b = old.summary(), new.summary()
    rows: list[tuple[str, object, object]] = [
        ("workflow", a["workflow_id"], b["workflow_id"]),
        ("run", a["run_id"], b["run_id"]),
        ("status", a["status"], b["status"]),
        ("reward", a["reward"], b["reward"]),
        ("turns", a["turns"], b["turns"]),
        ("env failures", a["env_failures"], b["env_failures"]),
        ("policy version", a["policy_version"], b["policy_version"]),
        ("seed", a["seed"], b["seed"]),
        ("error", a["error"], b["error"]),
        ("first observation", a["first_observation"], b["first_observation"]),
    ]
    acts_a, acts_b = list(a["actions"]), list(b["actions"])  # type: ignore[call-overload]
    obs_a, obs_b = list(a["observations"]), list(b["observations"])  # type: ignore[call-overload]
    for i in range(max(len(acts_a), len(acts_b))):
        rows.append((f"turn {i + 1} action", _at(acts_a, i), _at(acts_b, i)))
        rows.append((f"turn {i + 1} observation", _at(obs_a, i), _at(obs_b, i)))
    label = max(len(r[0]) for r in rows)
    lines = [f"{'':{label}}   {titles[0]:{width}}   {titles[1]}"]
    for name, x, y in rows:
        mark = "=" if x == y else "≠"
        lines.append(f"{name:{label}} {mark} {shorten(x, width):{width}}   {shorten(y, width)}")
    return "\n".join(lines)


def _at(items: list[object], i: int) -> object:
    return items[i] if i < len(items) else None


def as_json(old: Outcome, new: Outcome, **extra: object) -> str:
    return json.dumps({"original": old.summary(), "replay": new.summary(), **extra}, indent=2)


# --- where to reset ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResetPoint:
    event_id: int
    """The WorkflowTaskCompleted event to reset to."""
    failure_event_id: int
    failure: str
    """What failed there, in words."""


class NoResetPoint(ValueError):
    """The history has no failure to continue from (or fails before its first workflow task completed)."""


_FAILURES = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT,
    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
}


def find_reset_point(events: Iterable[HistoryEvent]) -> ResetPoint:
    """The last WorkflowTaskCompleted before the first failure event. Raises `NoResetPoint`.

    A workflow task failed *by a reset* (the mark a previous reset leaves) is not a failure. Workflow task
    timeouts are not either: they happen whenever a worker restarts, and the task simply runs elsewhere.
    """
    last_completed: int | None = None
    activity_types: dict[int, str] = {}
    for e in events:
        kind = e.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            last_completed = e.event_id
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            activity_types[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
        elif kind in _FAILURES:
            if (
                kind == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
                and e.workflow_task_failed_event_attributes.cause
                == WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW
            ):
                continue
            if last_completed is None:
                raise NoResetPoint(f"event {e.event_id} fails before the first workflow task completed")
            return ResetPoint(
                event_id=last_completed, failure_event_id=e.event_id, failure=_describe(e, activity_types)
            )
    raise NoResetPoint("no failure in this history: nothing to continue from")


def _describe(e: HistoryEvent, activity_types: dict[int, str]) -> str:
    kind = e.event_type
    if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
        a = e.activity_task_failed_event_attributes
        kind_name = a.failure.application_failure_info.type or a.failure.cause.application_failure_info.type
        what = activity_types.get(a.scheduled_event_id, "activity")
        return f"{what} failed ({kind_name or 'error'}): {a.failure.message}"
    if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
        t = e.activity_task_timed_out_event_attributes
        timeout = t.failure.timeout_failure_info.timeout_type
        return f"{activity_types.get(t.scheduled_event_id, 'activity')} timed out ({TimeoutType.Name(timeout)})"
    if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
        return f"workflow task failed: {e.workflow_task_failed_event_attributes.failure.message}"
    if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
        return f"workflow failed: {e.workflow_execution_failed_event_attributes.failure.message}"
    return EventType.Name(kind).removeprefix("EVENT_TYPE_").lower()
