"""`trajflow replay WORKFLOW_ID`: run an ended trajectory again, or continue it from before its failure, and show
the old result beside the new.

- Re-run (default): the original's `TrajectoryRequest` is read from its history (the start event's input), so the
  new trajectory has the very same request - same env, seed, prompt, sampling, pools, policy - with `replay_of`
  set. It runs as `{id}-replay-{hex6}` on the original's task queue, and reports to nobody: a training run never
  counts or trains on a replay (it still carries the run's TrajflowRun, so `trajectories list --run` shows it,
  marked in REPLAY OF). The policy may have moved on and sampling is random, so actions may differ; the env's
  first observation (same seed) must not.
- `--from-failure`: Temporal's reset (`ResetWorkflowExecution`) to the last WorkflowTaskCompleted before the
  first failure (`trajflow.cli.replay.formatting.find_reset_point`). The same workflow id gets a new run that keeps the
  history up to there and runs on from it, with the state it had then: the turns before the failure are not generated
  again, and the sandbox-recovery budget is what it was before the failure. The old run stays readable.

What a reset run reports to its training run: it signals its end again under the *same* workflow id. The
TrainingWorkflow counts it as `late` when the trajectory's group was already trained on, dropped or abandoned, or
when the failed member was already replaced (it is no longer among the group's running members), and as
`duplicates` if that trajectory's completed sample is already in the group: a reset never makes the run train on
a trajectory twice or count a failure twice. Only in a group of user-started trajectories (run id set, no
`report_to`) that is still open does a reset's completed result join the group. The record is stored under the
new run id, so the old run's record stays beside it.

Limits: the original must have ended (a running one has no result to compare). A reset re-issues what failed
with the workflow's state of then: a step on a sandbox that has since died fails again at once and is restored by
replay only if the recovery budget allows one (`max_env_recoveries` >= 1); with a budget of 0 such a trajectory
ends infra-failed again - re-run it instead.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import FailureError
from temporalio.service import RPCError, RPCStatusCode

from trajflow.cli.replay.formatting import Outcome, ResetPoint, find_reset_point
from trajflow.contracts import names
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.trajectory import TrajectoryRequest, TrajectoryResult
from trajflow.infra.store import ObjectStore

Say = Callable[[str], None]


class ReplayError(RuntimeError):
    """The workflow cannot be replayed this way (not a trajectory, still running, nothing failed)."""


async def started_request(client: Client, workflow_id: str, run_id: str | None = None) -> tuple[TrajectoryRequest, str]:
    """The request a trajectory was started with and its task queue, from its history's first event."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    async for event in handle.fetch_history_events():
        attrs = event.workflow_execution_started_event_attributes
        if attrs.workflow_type.name != names.TRAJECTORY_WORKFLOW:
            raise ReplayError(f"{workflow_id} is a {attrs.workflow_type.name}, not a {names.TRAJECTORY_WORKFLOW}")
        if not attrs.input.payloads:  # started with no input (the UI's empty form): every default
            return TrajectoryRequest(), attrs.task_queue.name
        try:
            [req] = await client.data_converter.decode(list(attrs.input.payloads), [TrajectoryRequest])
        except ValueError as e:  # a pydantic ValidationError: the workflow itself failed on it
            raise ReplayError(f"{workflow_id} was started with input that does not validate: {e}") from None
        return req, attrs.task_queue.name
    raise ReplayError(f"{workflow_id} has an empty history")


async def outcome(client: Client, store: ObjectStore, workflow_id: str, run_id: str | None = None) -> Outcome:
    """How one run of a trajectory ended: its result and stored record. Raises ReplayError while it runs."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id, result_type=TrajectoryResult)
    desc = await handle.describe()
    assert desc.status is not None  # the server reports a status for every execution it describes
    if desc.status == WorkflowExecutionStatus.RUNNING:
        raise ReplayError(f"{workflow_id} is still running: wait for it to end (or cancel it) first")
    req, _ = await started_request(client, workflow_id, desc.run_id)
    try:
        result = await handle.result(follow_runs=False)
    except WorkflowFailureError as e:
        cause = e.cause.message if isinstance(e.cause, FailureError) else str(e)
        return Outcome(
            workflow_id, desc.run_id, None, None, failure=f"{desc.status.name.lower()}: {cause}", seed=req.seed
        )
    record = None
    if result.trajectory_uri:
        record = TrajectoryRecord.model_validate(await asyncio.to_thread(store.get_json, result.trajectory_uri))
    return Outcome(workflow_id, desc.run_id, result, record, seed=req.seed)


def replay_id(workflow_id: str) -> str:
    return f"{workflow_id}-replay-{uuid.uuid4().hex[:6]}"


async def rerun(
    client: Client, store: ObjectStore, workflow_id: str, timeout_s: float, say: Say = lambda _: None
) -> tuple[Outcome, Outcome]:
    """Run the trajectory again with the same request (`replay_of` set); returns (original, replay)."""
    old = await outcome(client, store, workflow_id)
    req, queue = await started_request(client, workflow_id)
    handle = await client.start_workflow(
        names.TRAJECTORY_WORKFLOW,
        req.model_copy(update={"replay_of": workflow_id}),
        id=replay_id(workflow_id),
        task_queue=queue,
        result_type=TrajectoryResult,
    )
    say(f"started {handle.id} ({req.env_id}, seed {req.seed}, queue {queue}); waiting ...")
    await _wait(handle.result(), timeout_s, handle.id)
    return old, await outcome(client, store, handle.id)


async def reset_to(client: Client, workflow_id: str, run_id: str, point: ResetPoint, reason: str) -> str:
    """Reset the run to `point`; returns the new run's id."""
    resp = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
            reason=reason,
            workflow_task_finish_event_id=point.event_id,
            request_id=str(uuid.uuid4()),
            identity=client.identity,
        )
    )
    return resp.run_id


async def continue_from_failure(
    client: Client, store: ObjectStore, workflow_id: str, timeout_s: float, say: Say = lambda _: None
) -> tuple[Outcome, Outcome, ResetPoint]:
    """Reset the trajectory's latest run to before its first failure and wait; returns (old, new, point)."""
    old = await outcome(client, store, workflow_id)
    events = [e async for e in client.get_workflow_handle(workflow_id, run_id=old.run_id).fetch_history_events()]
    point = find_reset_point(events)
    say(f"first failure: event {point.failure_event_id}, {point.failure}")
    new_run = await reset_to(
        client, workflow_id, old.run_id, point, f"trajflow replay --from-failure ({point.failure})"
    )
    say(f"reset {workflow_id} to event {point.event_id}: new run {new_run}; waiting ...")
    handle = client.get_workflow_handle(workflow_id, run_id=new_run, result_type=TrajectoryResult)
    await _wait(handle.result(follow_runs=False), timeout_s, f"{workflow_id} (run {new_run})")
    return old, await outcome(client, store, workflow_id, new_run), point


async def _wait(result: object, timeout_s: float, what: str) -> None:
    try:
        await asyncio.wait_for(result, timeout_s)  # type: ignore[arg-type]
    except TimeoutError:
        raise ReplayError(f"{what} did not end within {timeout_s:.0f}s; it goes on: see the Web UI") from None
    except WorkflowFailureError:
        pass  # the outcome shows how it failed


async def main(workflow_id: str, mode: str, timeout_s: float, as_json: bool, say: Say) -> int:
    """What `trajflow replay` does in each mode ("rerun", "from-failure", "env-only"); returns the exit code:
    0 when the new run completed (env-only: finished without error), 1 otherwise, 2 when it could not start."""
    from trajflow.cli.replay import formatting as fmt
    from trajflow.infra.settings import load_settings
    from trajflow.infra.store import open_store_from
    from trajflow.infra.temporal import connect

    settings = load_settings()
    client = await connect(settings)
    store = open_store_from(settings)
    try:
        if mode == "env-only":
            from trajflow.cli.replay.env_only import replay_env

            return await replay_env(client, store, workflow_id, timeout_s, as_json, print)
        if mode == "from-failure":
            old, new, point = await continue_from_failure(client, store, workflow_id, timeout_s, say)
            titles, extra = (
                ("before the reset", "after the reset"),
                {"reset_to_event": point.event_id, "failure": point.failure},
            )
        else:
            old, new = await rerun(client, store, workflow_id, timeout_s, say)
            titles, extra = ("original", "replay"), {}
    except (ReplayError, fmt.NoResetPoint) as e:
        say(f"replay: {e}")
        return 2
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise
        say(f"replay: no workflow {workflow_id!r}: {e}")
        return 2
    print(fmt.as_json(old, new, **extra) if as_json else fmt.side_by_side(old, new, titles))
    return 0 if new.result is not None and new.result.status.value == "completed" else 1
