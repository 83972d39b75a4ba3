"""`trajflow status RUN`: the live state of a training run, or of one trajectory, from the workflows' queries.

RUN is a TrainingWorkflow id (= the run id): its `progress` query (version of steps, α, buffer, running,
counters, paused, last step) and its TrajflowStatus, then each running trajectory of the run (visibility:
`TrajflowRun = RUN AND ExecutionStatus = 'Running'`) with its own `progress` query (turn, sandbox, host queue,
env failures, last observation). RUN may also be a TrajectoryWorkflow id: that trajectory's query and attributes.

Limits: queries are answered by an orchestrator worker, so with none polling they time out (said per row); at most
`limit` trajectories are queried; visibility lags a moment behind the workflows.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from trajflow.cli.commands.per_task import task_lines
from trajflow.cli.commands.visibility import list_trajectories, quote
from trajflow.cli.replay.formatting import shorten
from trajflow.contracts import names
from trajflow.contracts.training import TrainingProgress
from trajflow.contracts.trajectory import TrajectoryProgress

QUERY_TIMEOUT = timedelta(seconds=10)


class NotFound(LookupError):
    pass


def _attributes(raw: dict[str, Any]) -> dict[str, Any]:
    """The Trajflow* search attributes of a description, single values unwrapped."""
    return {k: (v[0] if isinstance(v, list) and len(v) == 1 else v) for k, v in raw.items() if k.startswith("Trajflow")}


async def _query(
    client: Client, workflow_id: str, result_type: type[TrajectoryProgress] | type[TrainingProgress]
) -> tuple[dict[str, Any] | None, str | None]:
    """The workflow's `progress` answer as JSON (the form `--json` prints), or why there is none."""
    try:
        handle = client.get_workflow_handle(workflow_id)
        value = await handle.query(names.QUERY_PROGRESS, result_type=result_type, rpc_timeout=QUERY_TIMEOUT)
        return value.model_dump(mode="json"), None
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"


async def describe(client: Client, workflow_id: str) -> tuple[str, str, dict[str, Any]]:
    """(workflow type, execution status, Trajflow* attributes) of a workflow's latest run."""
    try:
        desc = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise NotFound(f"no workflow {workflow_id!r}") from None
        raise
    status = desc.status.name.lower() if desc.status else "unknown"
    return desc.workflow_type, status, _attributes(dict(desc.search_attributes))


async def trajectory_status(client: Client, workflow_id: str) -> dict[str, Any]:
    _, execution, attrs = await describe(client, workflow_id)
    progress, error = await _query(client, workflow_id, TrajectoryProgress)
    return {
        "kind": "trajectory",
        "workflow_id": workflow_id,
        "execution_status": execution,
        "attributes": attrs,
        "progress": progress,
        "query_error": error,
    }


async def run_status(client: Client, run_id: str, limit: int) -> dict[str, Any]:
    _, execution, attrs = await describe(client, run_id)
    progress, error = await _query(client, run_id, TrainingProgress)
    query = (
        f"WorkflowType = {quote(names.TRAJECTORY_WORKFLOW)} AND {names.SA_RUN} = {quote(run_id)} "
        "AND ExecutionStatus = 'Running'"
    )
    rows = await list_trajectories(client, query, limit)
    answers = await asyncio.gather(*(_query(client, r.workflow_id, TrajectoryProgress) for r in rows))
    trajectories = [
        {"workflow_id": r.workflow_id, "replay_of": r.replay_of, "progress": p, "query_error": err}
        for r, (p, err) in zip(rows, answers, strict=True)
    ]
    return {
        "kind": "training",
        "workflow_id": run_id,
        "execution_status": execution,
        "attributes": attrs,
        "progress": progress,
        "query_error": error,
        "trajectories_query": query,
        "trajectories": trajectories,
    }


async def status(client: Client, target: str, limit: int) -> dict[str, Any]:
    """The live state of `target`: a training run or a trajectory. Raises NotFound."""
    kind, _, _ = await describe(client, target)
    if kind == names.TRAINING_WORKFLOW:
        return await run_status(client, target, limit)
    if kind == names.TRAJECTORY_WORKFLOW:
        return await trajectory_status(client, target)
    raise NotFound(f"{target} is a {kind}: status shows a {names.TRAINING_WORKFLOW} or a {names.TRAJECTORY_WORKFLOW}")


def _trajectory_line(wid: str, answer: dict[str, Any] | None, error: str | None, width: int) -> str:
    if answer is None:
        return f"{wid}  (no answer: {shorten(error, width)})"
    p = TrajectoryProgress.model_validate(answer)
    return (
        f"{wid}  turn {p.turn}/{p.max_turns}  sandbox {p.sandbox or '-'}  "
        f"host {p.host_queue or '-'}  env failures {p.env_recoveries}\n"
        f"    last observation: {shorten(p.last_observation, width)}"
    )


def _lags(histogram: dict[int, int]) -> str:
    """A step's staleness histogram as `lag×samples`: "0×6 1×2"."""
    return " ".join(f"{lag}×{n}" for lag, n in sorted(histogram.items())) or "-"


def format_status(s: dict[str, Any], width: int = 100) -> str:
    """The status as text (the `--json` form is `s` itself)."""
    attrs = s["attributes"]
    head = f"{s['kind']} {s['workflow_id']}: {attrs.get(names.SA_STATUS, '-')} (workflow {s['execution_status']})"
    if s["kind"] == "trajectory":
        lines = [head, "attributes: " + ", ".join(f"{k}={v}" for k, v in sorted(attrs.items()))]
        lines.append(_trajectory_line(s["workflow_id"], s["progress"], s["query_error"], width))
        return "\n".join(lines)
    lines = [head]
    if s["progress"] is None:
        lines.append(f"progress: no answer ({s['query_error']})")
    else:
        p = TrainingProgress.model_validate(s["progress"])
        lines.append(f"version {p.version}/{p.steps}  alpha {p.alpha}  elapsed {p.elapsed_s:.1f}s")
        lines.append(f"buffer {p.buffered} completed samples waiting  running {p.running}")
        lines.append("counters " + "  ".join(f"{k} {v}" for k, v in p.counters.model_dump().items()))
        lines.append(f"paused: {p.paused or 'no'}")
        last = p.last
        if last:
            metrics = " ".join(f"{k}={v:.4g}" for k, v in sorted(last.metrics.items()))
            lines.append(
                f"last step: v{last.step} at {last.time_s:.1f}s, reward mean {last.reward_mean:.3f} over "
                f"{last.trajectories} trajectories, staleness {_lags(last.staleness)}, train {last.train_s:.2f}s"
                + (f"\n    {metrics}" if metrics else "")
            )
        per_task = task_lines(p)
        if per_task:
            lines.append("per task (trajectories trained, their mean reward and wins):")
            lines += per_task
    lines.append(f"running trajectories ({len(s['trajectories'])}; query: {s['trajectories_query']}):")
    for t in s["trajectories"]:
        mark = f" [replay of {t['replay_of']}]" if t["replay_of"] else ""
        lines.append("  " + _trajectory_line(t["workflow_id"] + mark, t["progress"], t["query_error"], width))
    return "\n".join(lines)


async def main(target: str, limit: int, as_json: bool) -> int:
    from trajflow.infra.settings import load_settings
    from trajflow.infra.temporal import connect

    client = await connect(load_settings())
    try:
        s = await status(client, target, limit)
    except NotFound as e:
        print(e)
        return 2
    print(json.dumps(s, indent=2, default=str) if as_json else format_status(s))
    return 0
