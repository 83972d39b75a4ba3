"""Child watcher: tells a training run which of the trajectories it inherited through continue-as-new have closed.

A training run notices a child that ends without reporting by awaiting its handle, and that handle dies with the
run that started the child. The next run hands the children it inherited to this activity, which reads their
status through the Temporal client every `poll_s` seconds (heartbeating) and returns once some have closed: a
completed one with its result (its report may have been lost), the others with their status.

Limits: polling (one describe per watched child per poll): fine for the in-flight children of one run (bounded by
admission), not meant for thousands.
"""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from trajflow.contracts import names
from trajflow.contracts.training import ChildOutcome, WatchChildrenInput, WatchChildrenResult
from trajflow.contracts.trajectory import TrajectoryResult


class ChildWatchActivities:
    def __init__(self, client: Client) -> None:
        self.client = client

    @activity.defn(name=names.WATCH_CHILDREN)
    async def watch_children(self, inp: WatchChildrenInput) -> WatchChildrenResult:
        while True:
            closed = [o for wid in inp.workflow_ids if (o := await self._outcome(wid, inp.results)) is not None]
            if closed:
                return WatchChildrenResult(closed=closed)
            activity.heartbeat(f"{len(inp.workflow_ids)} running")
            await asyncio.sleep(inp.poll_s)

    async def _outcome(self, workflow_id: str, results: bool = True) -> ChildOutcome | None:
        """The child's outcome once closed (with a completed child's result if `results`), None while it runs."""
        handle = self.client.get_workflow_handle(workflow_id, result_type=TrajectoryResult)
        try:
            status = (await handle.describe()).status
        except RPCError as e:
            if e.status is RPCStatusCode.NOT_FOUND:  # never started (or long deleted): it will not report
                return ChildOutcome(workflow_id=workflow_id, status="NOT_FOUND")
            raise
        if status is None or status is WorkflowExecutionStatus.RUNNING:
            return None
        result = await handle.result() if results and status is WorkflowExecutionStatus.COMPLETED else None
        return ChildOutcome(workflow_id=workflow_id, status=status.name, result=result)
