"""The TrainingWorkflow's side of a sharded run (`[train] groups_per_shard`): starting its shard workflows and
noticing those that close without reporting every group, whose groups are then written off (`ShardBook`).

A shard this run started is watched by its handle; shards inherited through continue-as-new (their handles died
with the previous run) by the child-watcher activity, as a direct run watches its inherited trajectories.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ChildWorkflowError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from trajflow.contracts import names
    from trajflow.contracts.shards import shard_id
    from trajflow.contracts.training import ShardStart, WatchChildrenInput
    from trajflow.workflows.fanin import ShardBook

from trajflow.workflows import attributes as keys
from trajflow.workflows import stubs


async def start_shard(book: ShardBook, start: ShardStart) -> None:
    """Start the shard `start` describes (its groups are already admitted in `book`) and watch it."""
    wid = shard_id(start.run_id, start.groups[0].k)
    try:
        handle = await workflow.start_child_workflow(
            names.SHARD_WORKFLOW,
            start,
            id=wid,
            task_queue=workflow.info().task_queue,  # shards run where their training workflow runs
            parent_close_policy=ParentClosePolicy.ABANDON,  # they outlive continue-as-new, as trajectories do
            search_attributes=TypedSearchAttributes([SearchAttributePair(keys.SA_RUN, start.run_id)]),
        )
    except BaseException:
        book.shard_not_started(start)
        raise
    book.shard_started()
    asyncio.create_task(_watch(book, handle, wid))


async def _watch(book: ShardBook, handle: workflow.ChildWorkflowHandle, wid: str) -> None:
    how = "completed"
    try:
        await handle
    except ChildWorkflowError as e:
        how = str(e)
    closed(book, wid, how)


async def watch_inherited(book: ShardBook, wids: list[str]) -> None:
    """Shards a previous run started, watched by the child-watcher activity until each closed."""
    while wids := [w for w in wids if book.is_live(w)]:
        res = await stubs.watch_children(WatchChildrenInput(workflow_ids=wids, results=False))
        for child in res.closed:
            closed(book, child.workflow_id, child.status)


def closed(book: ShardBook, wid: str, how: str) -> None:
    """The shard `wid` closed: its groups that never reported are written off (logged)."""
    lost = book.shard_closed(wid)
    if lost:
        workflow.logger.warning("shard %s closed (%s) before reporting %d of its groups", wid, how, len(lost))
