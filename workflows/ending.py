"""How a trajectory ends, outside its episode: the finished metric, the search attributes it ends with, and its
report to the run or collector that waits for it (`TrajectoryRequest.report_target`)."""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from trajflow.contracts import metrics, names
    from trajflow.contracts.trajectory import TrajectoryRequest, TrajectoryResult
    from trajflow.observability.metrics import record

from trajflow.workflows import attributes as keys


def record_end(req: TrajectoryRequest, result: TrajectoryResult) -> None:
    """Count the trajectory as finished and set its status, turns, reward and policy version for search."""
    task = req.task or req.env_id
    status = result.status.value
    record(workflow.metric_meter(), metrics.TRAJECTORIES_FINISHED, 1, run=req.run_id, task=task, status=status)
    updates = [keys.SA_STATUS.value_set(result.status.value), keys.SA_TURNS.value_set(result.turns)]
    if result.reward is not None:
        updates.append(keys.SA_REWARD.value_set(result.reward))
    if result.policy_version is not None:
        updates.append(keys.SA_VERSION.value_set(result.policy_version))
    workflow.upsert_search_attributes(list(updates))


async def report(req: TrajectoryRequest, result: TrajectoryResult) -> None:
    """Signal the report target, if any; a target that is gone is logged, never a failure of the trajectory."""
    target = req.report_target()
    if not target:
        return
    signal = workflow.get_external_workflow_handle(target).signal(
        names.SIGNAL_TRAJECTORY_FINISHED, result.report(req.group)
    )
    try:
        # Shielded: a cancel that arrives with the signal's outcome (the run terminated as this trajectory ended,
        # then swept) must not cancel the signal too; Temporal's SDK fails every task of the workflow with "Invalid
        # transition in state machine" then, and the trajectory never ends.
        await asyncio.shield(asyncio.ensure_future(signal))
    except ApplicationError as e:
        workflow.logger.warning("could not report to %s: %s", target, e)
