"""TrainingWorkflow: the α-bounded asynchronous RL loop (DESIGN.md "The training loop and α").

    while version < steps:
        admit groups within the staleness budget      (runs beside the loop, all the time)
        wait for B fresh samples; drop stale ones     (hard bound at consumption)
        train one step on the trainer pool            (publishes version + 1)
        continue as new when history grows long

Trajectories are child workflows (abandoned on close, so they outlive continue-as-new) that report back with a
small `TrajectoryReport` signal; trajectories a user starts with this run's id report the same way and are
trained in groups of their own. Redundant samples (r per group) are started on top of the budget and cancelled
once n of their group completed. `sync` is the α = 0 barrier: one batch is started after each step and the step
trains only when every sample of that batch has ended. A run of `pause_after_infra_failures` infra-failed
trajectories stops admission (a circuit breaker: status `paused`, an error log, `progress().paused`); probe
groups test the infrastructure now and then, and the first trajectory that does not fail on it resumes admission.

Limits: a child that dies without reporting (terminated by hand, a workflow bug) is noticed only while this run
of the workflow is the one that started it (its watcher does not survive continue-as-new); its group then waits
for replacements from the restart budget.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.common import RawValue, SearchAttributeKey
from temporalio.exceptions import ChildWorkflowError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from contracts import names
    from contracts.training import (
        GroupState,
        StepRecord,
        TrainingProgress,
        TrainingResult,
        TrainingRunConfig,
        TrainingStart,
        TrainingState,
        TrainRef,
        TrainStepInput,
    )
    from contracts.trajectory import TrajectoryReport, TrajectoryResult, TrajectoryStatus

from workflows import stubs
from workflows.inputs import NO_INPUT, decode_input

SA_RUN = SearchAttributeKey.for_keyword(names.SA_RUN)
SA_STATUS = SearchAttributeKey.for_keyword(names.SA_STATUS)
SA_VERSION = SearchAttributeKey.for_int(names.SA_POLICY_VERSION)
HISTORY_KEPT = 200
"""Step records kept in workflow state; the trainer also writes every step's record to the store."""


@workflow.defn(name=names.TRAINING_WORKFLOW)
class TrainingWorkflow:
    @workflow.init
    def __init__(self, raw: RawValue = NO_INPUT) -> None:
        # a TrainingStart, decoded here so that bad input fails the workflow, not its task (workflows/inputs.py)
        start = decode_input(raw, TrainingStart)
        self.cfg: TrainingRunConfig = start.run
        self.s: TrainingState = start.resume or TrainingState(
            run_id=workflow.info().workflow_id, started_at=workflow.time()
        )
        self.to_cancel: list[str] = []
        self.replacements: list[tuple[str, int]] = []
        """(group, how many) replacement samples to start for groups whose members failed."""
        self.training = False
        self.pause_admission = False
        """Set while the workflow continues as new."""
        self.probe = False
        """While paused on infra failures: admit one probe group now."""
        self.prober: asyncio.Task[None] | None = None

    # --- the loop ------------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, raw: RawValue = NO_INPUT) -> TrainingResult:
        cfg = self.cfg
        self._upsert_status("paused" if self.s.paused else "training")
        admission = asyncio.create_task(self._admission_loop())
        if self.s.paused:
            self._start_prober()
        try:
            while self.s.version < cfg.steps:
                groups = await self._wait_for_batch()
                await self._train(groups)
                if self.s.version < cfg.steps and self._history_is_long():
                    await self._continue_as_new(admission)
        finally:
            admission.cancel()
        await self._cancel_leftovers()
        self._upsert_status("done")
        return TrainingResult(
            run_id=self.s.run_id,
            version=self.s.version,
            counters=self.s.counters,
            history=self.s.history,
            wall_seconds=workflow.time() - self.s.started_at,
        )

    async def _admission_loop(self) -> None:
        """Start groups whenever the staleness budget allows, and cancel redundant samples no longer needed."""
        while True:
            await workflow.wait_condition(
                lambda: bool(self.to_cancel)
                or (bool(self.replacements) and self._may_replace())
                or self._groups_to_admit() > 0
            )
            await self._send_cancels()
            while self.replacements and self._may_replace():
                key, missing = self.replacements.pop(0)
                if self.s.paused:
                    self.probe = False  # the probe is this group's replacement members
                if key in self.s.groups:
                    group = self.s.groups[key]
                    await asyncio.gather(*(self._start_member(group) for _ in range(missing)))
            for _ in range(self._groups_to_admit()):
                await self._start_group()

    def _may_replace(self) -> bool:
        """Replacements for failed members wait while admission is paused (they would fail the same way), but
        for a probe: the groups waiting for them hold the staleness budget, so a probe is a replacement first."""
        return not self.pause_admission and (not self.s.paused or self.probe)

    def _groups_to_admit(self) -> int:
        """Admission control: at most (v + α + 1)·B − (consumed + running) samples started.

        `running` counts n per admitted group not yet trained on (in flight or finished and waiting), so with
        consumed = v·B the bound keeps (α + 1)·B useful samples in the pipeline. Redundant extras come on top.
        """
        cfg, s = self.cfg, self.s
        if self.pause_admission or s.version >= cfg.steps or (s.paused and not self.probe):
            return 0
        if cfg.sync and (self.training or self._open_groups()):
            return 0  # the barrier: the next batch starts only after this one is trained
        budget = (s.version + cfg.alpha + 1) * cfg.batch_size - (s.counters.consumed + self._running())
        # never start more than the run can still use (a batch being trained is already consumed)
        remaining = cfg.steps * cfg.batch_size - s.counters.consumed - self._running()
        groups = max(0, min(budget, remaining) // cfg.group_size)
        return min(groups, 1) if s.paused else groups

    def _running(self) -> int:
        return sum(self.cfg.group_size for g in self._open_groups())

    def _open_groups(self) -> list[GroupState]:
        return [g for g in self.s.groups.values() if not g.external]

    async def _start_group(self) -> None:
        cfg, s = self.cfg, self.s
        k = s.next_group
        s.next_group += 1
        self.probe = False
        task = self._pick_task(k)
        group = GroupState(group=f"g{k:06d}", seed=cfg.first_seed + k, task=task, started_version=s.version)
        s.groups[group.group] = group
        # the group's starts go out in one workflow activation, not one round trip each
        await asyncio.gather(*(self._start_member(group) for _ in range(cfg.group_size + cfg.redundancy)))

    def _pick_task(self, k: int) -> int:
        """Weighted round robin: the task whose share of started groups lags its weight most."""
        tasks = self.cfg.tasks
        if len(tasks) == 1:
            return 0
        total = sum(t.weight for t in tasks)
        counts = [0] * len(tasks)
        for g in self.s.groups.values():
            if g.task >= 0:
                counts[g.task] += 1
        return max(range(len(tasks)), key=lambda i: tasks[i].weight / total * (k + 1) - counts[i])

    async def _start_member(self, group: GroupState) -> None:
        task = self.cfg.tasks[group.task]
        index = group.members_started
        group.members_started += 1
        wid = f"{self.s.run_id}-{group.group}-{index}"
        req = task.request(
            group.seed,
            run_id=self.s.run_id,
            policy=self.s.run_id,
            group=group.group,
            min_policy_version=self.s.version,
            report_to=workflow.info().workflow_id,
        )
        # Running from before the start is confirmed: when this workflow's tasks are delayed (its worker died),
        # a short child can finish and its report be delivered in the same activation as its start, and signals
        # are handled first. A report from a member not yet marked running would be dropped as late.
        group.running.append(wid)
        try:
            handle = await workflow.start_child_workflow(
                names.TRAJECTORY_WORKFLOW,
                req,
                id=wid,
                task_queue=workflow.info().task_queue,  # trajectories run where their training workflow runs
                parent_close_policy=ParentClosePolicy.ABANDON,
                result_type=TrajectoryResult,
            )
        except BaseException:
            group.running.remove(wid)
            raise
        self.s.counters.started += 1
        in_flight = sum(len(g.running) for g in self.s.groups.values())
        self.s.counters.max_in_flight = max(self.s.counters.max_in_flight, in_flight)
        asyncio.create_task(self._watch(handle, wid, group.group))

    async def _watch(self, handle: workflow.ChildWorkflowHandle, wid: str, group: str) -> None:
        """A child that ends without reporting (terminated, failed) counts as an infra failure of its group; one
        that completed but whose report never arrived (lost signal) is reported from its result."""
        try:
            result: TrajectoryResult = await handle
            g = self.s.groups.get(group)
            if g is not None and wid in g.running:
                workflow.logger.warning("trajectory %s completed without its report arriving: using its result", wid)
                self.trajectory_finished(
                    TrajectoryReport(
                        workflow_id=wid,
                        trajectory_uri=result.trajectory_uri,
                        group=group,
                        policy_version=result.policy_version,
                        reward=result.reward,
                        status=result.status,
                        error=result.error,
                    )
                )
        except ChildWorkflowError as e:
            g = self.s.groups.get(group)
            if g is None or wid not in g.running:
                return  # cancelled by us, or it reported before it failed
            self.trajectory_finished(
                TrajectoryReport(
                    workflow_id=wid,
                    trajectory_uri=None,
                    group=group,
                    policy_version=None,
                    reward=None,
                    status=TrajectoryStatus.INFRA_FAILED,
                )
            )
            workflow.logger.warning("trajectory %s ended without a report: %s", wid, e)

    async def _send_cancels(self) -> None:
        while self.to_cancel:
            await self._cancel(self.to_cancel.pop())

    async def _cancel(self, wid: str) -> None:
        try:
            await workflow.get_external_workflow_handle(wid).cancel()
        except Exception as e:  # already ended: nothing to cancel
            workflow.logger.info("cancel %s: %s", wid, e)

    async def _wait_for_batch(self) -> list[GroupState]:
        """Wait until B/n complete, fresh groups are ready; drop stale ones on the way (hard bound)."""
        need = self.cfg.batch_size // self.cfg.group_size
        while True:
            self._drop_stale()
            ready = self._ready_groups()
            if len(ready) >= need and not (self.cfg.sync and self._members_running()):
                return ready[:need]
            await workflow.wait_condition(lambda: self._batch_may_be_ready(need))

    def _batch_may_be_ready(self, need: int) -> bool:
        if self.cfg.sync and self._members_running():
            return False
        return len(self._ready_groups()) >= need or any(self._is_stale(g) for g in self._ready_groups())

    def _members_running(self) -> bool:
        return any(g.running for g in self.s.groups.values())

    def _ready_groups(self) -> list[GroupState]:
        n = self.cfg.group_size
        return [g for g in self.s.groups.values() if len(g.completed) >= n]

    def _is_stale(self, g: GroupState) -> bool:
        oldest = min(r.policy_version for r in g.completed)
        return self.s.version - oldest > self.cfg.alpha

    def _drop_stale(self) -> None:
        for g in [g for g in self._ready_groups() if self._is_stale(g)]:
            self.s.counters.dropped_stale += len(g.completed)
            workflow.logger.info("dropping stale group %s (trainer v%d)", g.group, self.s.version)
            self._close_group(g)

    async def _train(self, groups: list[GroupState]) -> None:
        cfg, s = self.cfg, self.s
        refs = [r for g in groups for r in g.completed[: cfg.group_size]]
        for g in groups:
            self._close_group(g)
        s.counters.consumed += len(refs)
        self.training = True
        try:
            res = await stubs.train_step(
                cfg.trainer_pool, TrainStepInput(run_id=s.run_id, version=s.version, refs=refs, trainer=cfg.trainer)
            )
        finally:
            self.training = False
        staleness = [s.version - r.policy_version for r in refs]
        s.version = res.version
        s.history.append(
            StepRecord(
                step=res.version,
                time_s=workflow.time() - s.started_at,
                reward_mean=sum(r.reward for r in refs) / len(refs),
                trajectories=len(refs),
                stale_dropped_total=s.counters.dropped_stale,
                staleness=staleness,
                metrics=res.metrics,
                train_s=res.seconds,
            )
        )
        del s.history[:-HISTORY_KEPT]
        workflow.upsert_search_attributes([SA_VERSION.value_set(s.version)])

    def _cancel_running(self, g: GroupState) -> None:
        """Queue the group's running members for cancellation (the admission loop sends it) and count them."""
        self.to_cancel.extend(g.running)
        self.s.counters.cancelled += len(g.running)
        g.running = []

    def _close_group(self, g: GroupState) -> None:
        """The group leaves the pipeline (trained, dropped or abandoned); its running members are cancelled."""
        self._cancel_running(g)
        self.s.groups.pop(g.group, None)
        self.s.consumed_groups.append(g.group)

    # --- reports -------------------------------------------------------------------------------------------

    @workflow.signal(name=names.SIGNAL_TRAJECTORY_FINISHED)
    def trajectory_finished(self, report: TrajectoryReport) -> None:
        s, c = self.s, self.s.counters
        key = report.group or f"user-{report.workflow_id}"
        if key in s.consumed_groups:
            c.late += 1  # its group was already trained on, dropped or abandoned
            return
        g = s.groups.get(key)
        if g is None:
            g = GroupState(group=key, seed=-1, task=-1, started_version=report.policy_version or 0, external=True)
            s.groups[key] = g
        if report.workflow_id in [r.workflow_id for r in g.completed]:
            c.duplicates += 1
            return
        if g.external:
            c.external += 1
        elif report.workflow_id not in g.running:
            c.late += 1  # a redundant sample of a full group that ended before its cancellation landed
            return
        else:
            g.running.remove(report.workflow_id)
        self._count(report)
        if report.status is TrajectoryStatus.COMPLETED and report.reward is not None and report.trajectory_uri:
            g.completed.append(
                TrainRef(
                    workflow_id=report.workflow_id,
                    trajectory_uri=report.trajectory_uri,
                    group=key,
                    reward=report.reward,
                    policy_version=report.policy_version or 0,
                )
            )
        else:
            g.failed += 1
        self._after_report(g)

    def _count(self, report: TrajectoryReport) -> None:
        s, c = self.s, self.s.counters
        if report.status is TrajectoryStatus.COMPLETED:
            c.completed += 1
        elif report.status is TrajectoryStatus.INFRA_FAILED:
            c.infra_failed += 1
        else:
            c.failed += 1
        if report.status is not TrajectoryStatus.INFRA_FAILED:
            s.infra_streak = 0
            if s.paused:
                self._resume(f"{report.workflow_id} ended {report.status.value}: the infrastructure works again")
            return
        s.infra_streak += 1
        if not s.paused and s.infra_streak >= self.cfg.pause_after_infra_failures:
            s.paused = (
                f"{s.infra_streak} trajectories in a row failed on infrastructure, the last ({report.workflow_id}) "
                f"with: {report.error or 'no error recorded'}"
            )
            c.admission_pauses += 1
            self._upsert_status("paused")
            workflow.logger.error(
                "ADMISSION PAUSED for run %s: %s. A probe group is admitted every so often; a completed "
                "trajectory, or the %r signal, resumes admission.",
                s.run_id,
                s.paused,
                names.SIGNAL_RESUME_ADMISSION,
            )
            self._start_prober()

    def _start_prober(self) -> None:
        if self.prober is None or self.prober.done():
            self.prober = asyncio.create_task(self._probe_while_paused())

    async def _probe_while_paused(self) -> None:
        """Half-open: admit one probe group after `pause_probe_s`, then after twice that (up to 10 min), until
        admission resumes."""
        delay = self.cfg.pause_probe_s
        while self.s.paused:
            try:
                await workflow.wait_condition(lambda: not self.s.paused, timeout=delay)
            except asyncio.TimeoutError:
                workflow.logger.warning("admission paused for run %s: admitting a probe group", self.s.run_id)
                self.probe = True
                delay = min(delay * 2, 600.0)

    @workflow.signal(name=names.SIGNAL_RESUME_ADMISSION)
    def resume_admission(self) -> None:
        """Resume admission now (after fixing what made trajectories fail on infrastructure)."""
        if self.s.paused:
            self._resume("resumed by signal")

    def _resume(self, why: str) -> None:
        workflow.logger.warning("admission resumed for run %s: %s", self.s.run_id, why)
        self.s.paused = None
        self.s.infra_streak = 0
        self.probe = False
        self._upsert_status("training")

    def _after_report(self, g: GroupState) -> None:
        n = self.cfg.group_size
        if len(g.completed) >= n:
            g.completed = g.completed[:n]
            self._cancel_running(g)  # the group is full: redundant samples are not needed
            return
        if g.external or g.running:
            return
        # members failed and none is left running: replace them, within the group's restart budget
        missing = n - len(g.completed)
        restarts_used = g.members_started - (n + self.cfg.redundancy)
        if restarts_used + missing > self.cfg.max_group_restarts:
            self.s.counters.groups_abandoned += 1
            workflow.logger.warning("abandoning group %s: %d members failed", g.group, g.failed)
            self._close_group(g)
            return
        self.replacements.append((g.group, missing))

    # --- state you can look at -------------------------------------------------------------------------------

    @workflow.query(name=names.QUERY_PROGRESS)
    def progress(self) -> TrainingProgress:
        s = self.s
        return TrainingProgress(
            run_id=s.run_id,
            version=s.version,
            steps=self.cfg.steps,
            alpha=self.cfg.alpha,
            running=sum(len(g.running) for g in s.groups.values()),
            buffered=sum(len(g.completed) for g in s.groups.values()),
            counters=s.counters,
            last=s.history[-1] if s.history else None,
            elapsed_s=workflow.time() - s.started_at,
            paused=s.paused,
        )

    @workflow.query(name=names.QUERY_STATE)
    def state(self) -> TrainingState:
        return self.s

    # --- housekeeping ----------------------------------------------------------------------------------------

    def _history_is_long(self) -> bool:
        info = workflow.info()
        return info.is_continue_as_new_suggested() or (
            info.get_current_history_length() >= self.cfg.history_events_before_continue
        )

    async def _continue_as_new(self, admission: asyncio.Task[None]) -> None:
        self.pause_admission = True
        await self._send_cancels()
        await workflow.wait_condition(workflow.all_handlers_finished)
        admission.cancel()
        self.s.continued += 1
        workflow.continue_as_new(TrainingStart(run=self.cfg, resume=self.s))

    async def _cancel_leftovers(self) -> None:
        for g in list(self.s.groups.values()):
            self._cancel_running(g)
        await self._send_cancels()

    def _upsert_status(self, status: str) -> None:
        workflow.upsert_search_attributes([SA_RUN.value_set(self.s.run_id), SA_STATUS.value_set(status)])

