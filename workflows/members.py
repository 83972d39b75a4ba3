"""Starting one member of a group as a child `TrajectoryWorkflow`: what the training workflow (a direct run) and a
shard workflow (a sharded run) both do, with the bookkeeping of `workflows.bookkeeping.Book` around the start."""

from __future__ import annotations

from temporalio import workflow
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from trajflow.contracts import names
    from trajflow.contracts.training import GroupState, TrainingRunConfig
    from trajflow.contracts.trajectory import TrajectoryResult
    from workflows.bookkeeping import Book


async def start_member(
    book: Book, cfg: TrainingRunConfig, group: GroupState, run_id: str, min_policy_version: int
) -> tuple[str, workflow.ChildWorkflowHandle]:
    """Start `group`'s next member (its seed derived from the group's and its number), reporting to this workflow
    and abandoned on close (it outlives continue-as-new); its workflow id and handle. A start that fails is taken
    back from the book."""
    task = cfg.tasks[group.task]
    wid = book.new_member(group)
    seed = cfg.member_seed(group.seed, group.members_started - 1)  # new_member counted this one
    req = task.request(
        group.seed,
        sampling=task.sampling.model_copy(update={"seed": seed}),
        run_id=run_id,
        policy=run_id,
        group=group.group,
        min_policy_version=min_policy_version,
        report_to=workflow.info().workflow_id,
    )
    try:
        handle = await workflow.start_child_workflow(
            names.TRAJECTORY_WORKFLOW,
            req,
            id=wid,
            task_queue=workflow.info().task_queue,  # trajectories run where their parent runs
            parent_close_policy=ParentClosePolicy.ABANDON,
            result_type=TrajectoryResult,
        )
    except BaseException:
        book.member_not_started(group, wid)
        raise
    book.member_started()
    return wid, handle
