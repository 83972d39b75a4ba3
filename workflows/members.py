"""Starting one member of a group as a child `TrajectoryWorkflow`: what the training workflow (a direct run) and a
shard workflow (a sharded run) both do, with the bookkeeping of `trajflow.workflows.bookkeeping.Book` around the start;
and sending the cancellations the book queued."""

from __future__ import annotations

from temporalio import workflow
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from trajflow.contracts import names
    from trajflow.contracts.rollouts import BranchPlan
    from trajflow.contracts.training import GroupState, TrainingRunConfig
    from trajflow.contracts.trajectory import TrajectoryResult
    from trajflow.workflows.bookkeeping import Book


async def start_member(
    book: Book,
    cfg: TrainingRunConfig,
    group: GroupState,
    run_id: str,
    min_policy_version: int,
    branch: BranchPlan | None = None,
) -> tuple[str, workflow.ChildWorkflowHandle]:
    """Start `group`'s next member (its seed derived from the group's and its number), reporting to this workflow
    and abandoned on close (it outlives continue-as-new); its workflow id and handle. A start that fails is taken
    back from the book. With `branch` (tree rollouts, `trajflow.workflows.trees`): a branch of one of the group's roots,
    its episode taken from the root's record; a start that fails puts the branch back at the front of the queue."""
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
    if branch is not None and group.tree is not None:
        group.tree.branches.append(wid)
        fields = {"branch_turn": branch.turn, "branch_record": branch.record_uri, "branch_index": branch.index}
        req = req.model_copy(update={"branch_of": branch.parent, **fields})
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
        if branch is not None and group.tree is not None:
            group.tree.queued.insert(0, branch)
        raise
    book.member_started()
    return wid, handle


async def send_cancels(book: Book) -> None:
    """Cancel the members `book` queued for cancellation (redundant samples, leftovers), each removed from the queue
    only once its cancel was sent: the state never loses a queued cancellation."""
    while book.to_cancel:
        wid = book.to_cancel[-1]
        try:
            await workflow.get_external_workflow_handle(wid).cancel()
        except Exception as e:  # already ended: nothing to cancel
            workflow.logger.info("cancel %s: %s", wid, e)
        book.to_cancel.remove(wid)
