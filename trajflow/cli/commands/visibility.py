"""`trajflow trajectories list`: trajectories found in Temporal visibility by their custom search attributes.

The visibility query is built by a pure function (`trajectory_query`) and printed with the listing, so the very
same filter can be pasted into the Temporal Web UI's search box. The attributes are those the TrajectoryWorkflow
keeps current (`trajflow.contracts.names`: TrajflowStatus, TrajflowRun, TrajflowEnv, TrajflowTask, ...).

Limits: visibility is eventually consistent (a trajectory that has just ended may show its previous state for a
moment); rows come in the server's order (newest first on the dev server) and stop at `limit`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime

from temporalio.client import Client, WorkflowExecution
from temporalio.common import SearchAttributeKey

from trajflow.contracts import names

TRAJFLOW_STATUSES = ("completed", "failed", "infra_failed", "running")
"""How a trajectory ended (TrajflowStatus, set by the workflow) - or `running` while it runs."""
EXECUTION_STATUSES = {"canceled": "Canceled", "terminated": "Terminated", "timed_out": "TimedOut"}
"""Ends that the workflow never saw itself (a cancelled redundant sample, a terminated run): Temporal's own status."""
STATUS_CHOICES = (*TRAJFLOW_STATUSES, *EXECUTION_STATUSES)

_ENV = SearchAttributeKey.for_keyword(names.SA_ENV)
_RUN = SearchAttributeKey.for_keyword(names.SA_RUN)
_STATUS = SearchAttributeKey.for_keyword(names.SA_STATUS)
_TASK = SearchAttributeKey.for_keyword(names.SA_TASK)
_REPLAY_OF = SearchAttributeKey.for_keyword(names.SA_REPLAY_OF)
_REWARD = SearchAttributeKey.for_float(names.SA_REWARD)
_VERSION = SearchAttributeKey.for_int(names.SA_POLICY_VERSION)
_FAILURES = SearchAttributeKey.for_int(names.SA_ENV_FAILURES)
_TURNS = SearchAttributeKey.for_int(names.SA_TURNS)


def quote(value: str) -> str:
    """A visibility-query string literal. Quotes and backslashes are refused rather than escaped: no id, env or
    task name of this project contains them, and the UI's parser and the server's must read the same thing."""
    if any(c in value for c in "'\"\\") or not value:
        raise ValueError(f"not usable in a visibility query: {value!r}")
    return f"'{value}'"


def trajectory_query(
    status: str | None = None,
    run: str | None = None,
    env: str | None = None,
    task: str | None = None,
    replay_of: str | None = None,
) -> str:
    """The visibility query for TrajectoryWorkflows with these filters (None: any). Raises ValueError."""
    clauses = [f"WorkflowType = {quote(names.TRAJECTORY_WORKFLOW)}"]
    if status is not None:
        if status == "running":
            # a cancelled or terminated trajectory keeps TrajflowStatus 'running': ask Temporal whether it runs
            clauses.append("ExecutionStatus = 'Running'")
        elif status in TRAJFLOW_STATUSES:
            clauses.append(f"{names.SA_STATUS} = {quote(status)}")
        elif status in EXECUTION_STATUSES:
            clauses.append(f"ExecutionStatus = {quote(EXECUTION_STATUSES[status])}")
        else:
            raise ValueError(f"unknown status {status!r}; one of {', '.join(STATUS_CHOICES)}")
    for attr, value in (
        (names.SA_RUN, run),
        (names.SA_ENV, env),
        (names.SA_TASK, task),
        (names.SA_REPLAY_OF, replay_of),
    ):
        if value is not None:
            clauses.append(f"{attr} = {quote(value)}")
    return " AND ".join(clauses)


@dataclass(frozen=True)
class TrajectoryRow:
    """One trajectory as visibility knows it (no store or history read)."""

    workflow_id: str
    status: str
    env: str | None
    task: str | None
    run: str | None
    version: int | None
    reward: float | None
    turns: int | None
    env_failures: int | None
    start_time: str
    replay_of: str | None
    execution_status: str


def row_of(wf: WorkflowExecution) -> TrajectoryRow:
    sa = wf.typed_search_attributes
    execution = wf.status.name.lower() if wf.status else "unknown"
    status = sa.get(_STATUS) or execution
    if status == "running" and execution != "running":
        status = execution  # the workflow was cancelled or terminated before it could say how it ended
    return TrajectoryRow(
        workflow_id=wf.id,
        status=status,
        env=sa.get(_ENV),
        task=sa.get(_TASK),
        run=sa.get(_RUN) or None,
        version=sa.get(_VERSION),
        reward=sa.get(_REWARD),
        turns=sa.get(_TURNS),
        env_failures=sa.get(_FAILURES),
        start_time=_iso(wf.start_time),
        replay_of=sa.get(_REPLAY_OF),
        execution_status=execution,
    )


def _iso(t: datetime | None) -> str:
    return t.astimezone().strftime("%Y-%m-%d %H:%M:%S") if t else ""


async def list_trajectories(client: Client, query: str, limit: int) -> list[TrajectoryRow]:
    return [row_of(wf) async for wf in client.list_workflows(query, limit=limit)]


COLUMNS = ("ID", "STATUS", "ENV", "TASK", "RUN", "VER", "REWARD", "TURNS", "ENV FAIL", "STARTED", "REPLAY OF")


def _cells(r: TrajectoryRow) -> tuple[str, ...]:
    def show(v: object) -> str:
        if v is None or v == "":
            return "-"
        return f"{v:g}" if isinstance(v, float) else str(v)

    return (
        r.workflow_id,
        r.status,
        show(r.env),
        show(r.task),
        show(r.run),
        show(r.version),
        show(r.reward),
        show(r.turns),
        show(r.env_failures),
        r.start_time,
        show(r.replay_of),
    )


def format_table(rows: list[TrajectoryRow]) -> str:
    """A plain-text table, one line per trajectory, columns as wide as their longest cell."""
    table = [COLUMNS, *(_cells(r) for r in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table)


def format_json(rows: list[TrajectoryRow], query: str) -> str:
    return json.dumps({"query": query, "trajectories": [asdict(r) for r in rows]}, indent=2)


async def main(
    status: str | None,
    run: str | None,
    env: str | None,
    task: str | None,
    replay_of: str | None,
    limit: int,
    as_json: bool,
) -> int:
    """What the command does: build the query, list, print (query first, so it can go to the UI's search box)."""
    from trajflow.infra.settings import load_settings
    from trajflow.infra.temporal import connect

    try:
        query = trajectory_query(status, run, env, task, replay_of)
    except ValueError as e:
        print(e)
        return 2
    client = await connect(load_settings())
    rows = await list_trajectories(client, query, limit)
    if as_json:
        print(format_json(rows, query))
        return 0
    print(f"query: {query}")
    print(format_table(rows) if rows else "no trajectory matches")
    if len(rows) == limit:
        print(f"(first {limit}; --limit shows more)")
    return 0
