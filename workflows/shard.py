"""ShardWorkflow: one level of a sharded training run's fan-in tree (`[train] groups_per_shard`, docs/capacity.md).

A sharded run's TrainingWorkflow starts shards of up to `groups_per_shard` groups. A shard starts its groups'
trajectories as its children (they report to it, not to the training workflow) and applies the group rules of
`trajflow.workflows.bookkeeping.Book` to them: redundant samples cancelled once n completed, replacements for failed
members within `max_group_restarts`, the group abandoned past it. When a group is complete the shard writes its samples
in member order to the store (`GroupManifest`, `training.save_group` on the group's reward pool) and signals one
`GroupReport` to the training workflow; an abandoned group is reported too. Once every group reported and every
member closed, it sends `ShardDone` (the counts of late reports since) and ends.

The shard never trains and never pauses admission (the training workflow does, on the group reports), and never
continues as new: its groups bound its history (`TrainSettings.limit_problems`). Cancelled (a stop `now`, the run's
end, the run cancelled), it cancels its running members first and sends its `ShardDone` with them counted. Its
children are abandoned on close, like a direct run's, so a member outlives a shard that was terminated; the training
workflow writes off such a shard's groups.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from trajflow.contracts import names
    from trajflow.contracts.shards import GroupCounts, GroupManifest, GroupReport, ShardDone, group_name
    from trajflow.contracts.training import GroupState, ShardStart, TrainingCounters, TrainingState
    from trajflow.contracts.trajectory import TrajectoryReport, TrajectoryResult, TrajectoryStatus
    from trajflow.workflows import flat
    from trajflow.workflows.bookkeeping import Book, _member_order

from trajflow.workflows import members, stubs
from trajflow.workflows.inputs import NO_INPUT, decode_input

START_BATCH = 64
"""Member starts sent in one workflow activation (the next batch goes once their starts are confirmed)."""
PATCH_START_BATCHES = "shard-start-batches"
PATCH_DONE_ON_CANCEL = "shard-done-on-cancel"
"""Changes of what a shard does, behind `workflow.patched` so that a shard that ran the code before them replays
as it ran (a worker upgraded under a live run; a query replaying a closed shard's history)."""


@workflow.defn(name=names.SHARD_WORKFLOW)
class ShardWorkflow:
    @workflow.init
    def __init__(self, raw: RawValue = NO_INPUT) -> None:
        self.start = decode_input(raw, ShardStart)
        # the shard's own pause never triggers: pausing admission is the training workflow's (on group reports); so
        # is dropping flat groups (the shard marks a complete group `flat`, the training workflow decides)
        cfg = self.start.run.model_copy(update={"pause_after_infra_failures": 100_000, "filter_flat_groups": False})
        self.cfg = cfg
        self.s = TrainingState(run_id=self.start.run_id, version=self.start.min_policy_version)
        self.book = Book(cfg, self.s)
        self.sent = TrainingCounters()
        """The counters as of the last message up (each message carries what was added since)."""
        self.last_error: str | None = None
        self.abandoned: list[int] = []
        """Groups abandoned (members failed past the restart budget) whose report has not gone up yet."""
        self.watchers = 0
        """Members started and not yet closed (the shard ends only once every one closed)."""

    @workflow.run
    async def run(self, raw: RawValue = NO_INPUT) -> None:
        book, start = self.book, self.start
        for spec in start.groups:
            group = GroupState(
                group=group_name(spec.k), seed=spec.seed, task=spec.task, started_version=start.min_policy_version
            )
            self.s.groups[group.group] = group
        try:
            n = self.cfg.group_size + self.cfg.redundancy
            starts = [g for g in list(self.s.groups.values()) for _ in range(n)]
            # START_BATCH starts an activation, not one round trip a group nor all at once (a shard of 64 groups of 8
            # is 512 starts: on a loaded worker one activation of them outran the SDK's 2 s deadlock detector)
            batch = START_BATCH if workflow.patched(PATCH_START_BATCHES) else len(starts)
            for i in range(0, len(starts), batch):
                await asyncio.gather(*(self._start_member(g) for g in starts[i : i + batch]))
            while self.s.groups or self.watchers or self.abandoned:
                await workflow.wait_condition(lambda: self._has_work() or not (self.s.groups or self.watchers))
                if True:
                    await members.send_cancels(self.book)
                    while (replacement := book.next_replacement()) is not None:
                        group, missing = replacement
                        await asyncio.gather(*(self._start_member(group) for _ in range(missing)))
                    for group in [g for g in self.s.groups.values() if len(g.completed) >= self.cfg.group_size]:
                        await self._complete(group)
                    while self.abandoned:
                        k = self.abandoned[0]
                        await self._report_group(GroupReport(shard=workflow.info().workflow_id, k=k, ready=False))
                        self.abandoned.pop(0)
                    await members.send_cancels(self.book)
            await workflow.wait_condition(workflow.all_handlers_finished)
            await self._done()
        except asyncio.CancelledError:
            book.cancel_leftovers()
            await members.send_cancels(self.book)
            if workflow.patched(PATCH_DONE_ON_CANCEL):
                # its last message carries the members it cancelled (the run's counters would miss them otherwise)
                await self._done()
            raise

    def _has_work(self) -> bool:
        n = self.cfg.group_size
        return (
            bool(self.book.to_cancel)
            or bool(self.book.replacements)
            or bool(self.abandoned)
            or any(len(g.completed) >= n for g in self.s.groups.values())
        )

    async def _start_member(self, group: GroupState) -> None:
        run_id, floor = self.start.run_id, self.start.min_policy_version
        wid, handle = await members.start_member(self.book, self.cfg, group, run_id, floor)
        self.watchers += 1
        asyncio.create_task(self._watch(handle, wid))

    async def _watch(self, handle: workflow.ChildWorkflowHandle, wid: str) -> None:
        try:
            try:
                result: TrajectoryResult | None = await handle
                self._ended(wid, result, "completed")
            except ChildWorkflowError as e:
                self._ended(wid, None, str(e))
        finally:
            self.watchers -= 1

    def _ended(self, wid: str, result: TrajectoryResult | None, how: str) -> None:
        report = self.book.ended_unreported(wid, result)
        if report is not None:
            workflow.logger.warning("trajectory %s closed (%s) without its report arriving", wid, how)
            self.trajectory_finished(report)

    @workflow.signal(name=names.SIGNAL_TRAJECTORY_FINISHED)
    def trajectory_finished(self, report: TrajectoryReport) -> None:
        if report.status is TrajectoryStatus.INFRA_FAILED:
            self.last_error = report.error or self.last_error
        outcome = self.book.report(report)
        if outcome.abandoned is not None:
            g = outcome.abandoned
            workflow.logger.warning("abandoning group %s: %d members failed", g.group, g.failed)
            self.abandoned.append(int(g.group[1:]))

    async def _complete(self, group: GroupState) -> None:
        """Write a complete group's manifest, report it up, close it (its redundant members are cancelled)."""
        n, k = self.cfg.group_size, int(group.group[1:])
        if group.group not in self.s.groups:
            return  # closed by an earlier pass
        refs = sorted(group.completed[:n], key=_member_order)
        manifest = GroupManifest(run_id=self.start.run_id, k=k, refs=refs)
        uri = await stubs.group_save(self.cfg.tasks[group.task].pools.reward, manifest)
        if group.group not in self.s.groups:
            return  # closed meanwhile (cancelled)
        self.book.close_group(group)
        oldest = min(r.policy_version for r in refs)
        rewards_flat = flat.group_is_flat(self.start.run, (r.reward for r in refs))
        shard = workflow.info().workflow_id
        await self._report_group(
            GroupReport(shard=shard, k=k, ready=True, oldest_version=oldest, manifest_uri=uri, flat=rewards_flat)
        )

    async def _report_group(self, report: GroupReport) -> None:
        await self._up(
            names.SIGNAL_GROUP_FINISHED,
            report.model_copy(update={"counts": self._counts(), "last_error": self.last_error}),
        )

    def _counts(self) -> GroupCounts:
        """What the counters gained since the last message up (and now counted as sent)."""
        now, before = self.s.counters, self.sent
        delta = GroupCounts(**{f: getattr(now, f) - getattr(before, f) for f in GroupCounts.model_fields})
        self.sent = now.model_copy()
        return delta

    async def _done(self) -> None:
        """The shard's last message up: what its counters gained since the last one."""
        first = self.start.groups[0].k
        await self._up(
            names.SIGNAL_SHARD_FINISHED,
            ShardDone(shard=workflow.info().workflow_id, first=first, counts=self._counts()),
        )

    async def _up(self, signal: str, message: GroupReport | ShardDone) -> None:
        try:
            await workflow.get_external_workflow_handle(self.start.run_id).signal(signal, message)
        except Exception as e:  # the training run is gone: nothing will train on this shard's groups
            workflow.logger.warning("could not report to %s: %s", self.start.run_id, e)
