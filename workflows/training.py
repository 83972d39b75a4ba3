"""TrainingWorkflow: the α-bounded asynchronous RL loop (DESIGN.md "The training loop and α").

    while version < steps:
        admit groups within the staleness budget      (runs beside the loop, all the time)
        wait for B fresh samples; drop stale ones     (hard bound at consumption)
        train one step on the trainer pool            (publishes version + 1)
        continue as new when history grows long, or when asked (the `continue_as_new` signal), from any wait

The rules live in workflows/bookkeeping.py (pure); this class does what they decide. Everything the loop needs to
go on is in `TrainingState` (queued cancellations and replacements, the probe, the step in flight), so a
continue-as-new at any waiting point loses nothing: a step in flight is issued again by the next run and the
trainer answers it once (activities/trainer.py).

Trajectories are child workflows (abandoned on close, so they outlive continue-as-new) that report back with a
small `TrajectoryReport` signal; trajectories a user starts with this run's id report the same way and are
trained in groups of their own. Redundant samples (r per group) are started on top of the budget and cancelled
once n of their group completed. `sync` is the α = 0 barrier: one batch is started after each step and the step
trains only when every sample of that batch has ended. A run of `pause_after_infra_failures` infra-failed
trajectories stops admission (a circuit breaker: status `paused`, an error log, `progress().paused`); probe
groups test the infrastructure now and then, and the first trajectory that does not fail on it resumes admission.

Ending early: the `stop` signal (`trajflow stop RUN`, a `StopRequest`) ends admission and, graceful, trains the
current step (the one in flight, or else the batch the running trajectories can still complete) or, `now`, cancels
every running trajectory at once; either way the rest is cancelled and the result says `stopped`. A cancelled run
cancels its running trajectories before it ends; a terminated one cannot, and the orchestrator's sweep
(workers/run_sweep.py) cancels those.

A child that ends without reporting (terminated by hand, a workflow bug) is an infra failure of its group; one
that completed but whose report was lost is reported from its result. A run watches the children it started by
their handles; those it inherited through continue-as-new, through the `training.watch_children` activity.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from trajflow.contracts import capacity, names
    from trajflow.contracts.rollouts import BranchPlan
    from trajflow.contracts.shards import GroupReport, ShardDone
    from trajflow.contracts.training import (
        GroupState,
        StopRequest,
        TrainingProgress,
        TrainingResult,
        TrainingRunConfig,
        TrainingStart,
        TrainingState,
        TrainStepInput,
        WatchChildrenInput,
    )
    from trajflow.contracts.trajectory import TrajectoryReport, TrajectoryResult
    from trajflow.workflows import queries
    from trajflow.workflows.bookkeeping import Book, ReportOutcome
    from trajflow.workflows.fanin import ShardBook

from trajflow.workflows import attributes as keys
from trajflow.workflows import members, preflight, sharding, stubs, trees
from trajflow.workflows.inputs import NO_INPUT, decode_input

SHARDS_CLOSE_S = 60.0
"""How long a sharded run's end waits for the last messages of the shards it cancelled."""
PATCH_WAIT_FOR_SHARDS = "sharded-end-waits-for-shards"
"""That wait, behind `workflow.patched`: a run that ended before it replays as it ran (e.g. for a query)."""
PATCH_REPORT_BUDGET = "continue-as-new-at-report-budget"
"""Continuing as new at `capacity.REPORTS_BEFORE_CONTINUE` reports, behind `workflow.patched`: a run recorded before
that rule replays as it ran."""


@workflow.defn(name=names.TRAINING_WORKFLOW)
class TrainingWorkflow:
    @workflow.init
    def __init__(self, raw: RawValue = NO_INPUT) -> None:
        # a TrainingStart, decoded here so that bad input fails the workflow, not its task (workflows/inputs.py)
        start = decode_input(raw, TrainingStart)
        if "@" in workflow.info().workflow_id and start.resume is None:
            # the run id is the policy name its trajectories ask for, and policy RUN@V pins version V of RUN
            raise ApplicationError(
                f"workflow id {workflow.info().workflow_id!r}: a training run's id is its policy name and may not "
                "contain '@' (RUN@V names version V of run RUN) — start it under another id",
                type=names.ERR_INVALID_INPUT,
                non_retryable=True,
            )
        self.cfg: TrainingRunConfig = start.run
        self.fresh = start.resume is None
        """A run's first execution (not one continued as new): it checks its decode engines before it starts."""
        self.s: TrainingState = start.resume or TrainingState(
            run_id=workflow.info().workflow_id, started_at=workflow.time()
        )
        self.book = Book(self.cfg, self.s)
        """The loop's rules (pure, workflows/bookkeeping.py); this class does their side effects."""
        self.shards: ShardBook | None = ShardBook(self.cfg, self.s) if self.cfg.shard_groups() else None
        """A sharded run's rules (workflows/fanin.py): admission in shards, group reports, batches of group ranges.
        None in a direct run."""
        self.rules: Book | ShardBook = self.shards or self.book
        """The rules the loop asks about batches, steps and stopping: the shard book in a sharded run."""
        self.pause_admission = False
        """Set while the workflow continues as new."""
        self.admitting = False
        """True while the admission loop starts or cancels children (continue-as-new waits for it to finish)."""
        self.continue_requested = False
        """Set by the `continue_as_new` signal, and at `capacity.REPORTS_BEFORE_CONTINUE` reports (`_reported`)."""
        self.reports = 0
        """Reports this run of the workflow received (Temporal limits a run's signals, `_reported`)."""
        self.prober: asyncio.Task[None] | None = None

    # --- the loop ------------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, raw: RawValue = NO_INPUT) -> TrainingResult:
        cfg = self.cfg
        if self.fresh and workflow.patched(preflight.PATCH_ENGINE_CHECK):
            await preflight.check_engines(cfg)
        self._upsert_status("paused" if self.s.paused else "training")
        admission = asyncio.create_task(self._admission_loop())
        if self.s.paused:
            self._start_prober()
        inherited = self.book.running_members()
        if inherited:
            asyncio.create_task(self._watch_inherited(inherited))
        if self.shards is not None and (live := self.shards.live_shards()):
            asyncio.create_task(sharding.watch_inherited(self.shards, live))
        book = self.rules
        try:
            while self.s.version < cfg.steps and not book.stop_due():
                # a step in flight when the previous run continued as new is issued again
                step = self.s.step or await self._wait_for_batch()
                if step is None and book.stop_due():
                    break
                if (
                    step is None
                    or not await self._train(step)
                    or (self.s.version < cfg.steps and not book.stop_due() and self._should_continue())
                ):
                    await self._continue_as_new(admission)
        except asyncio.CancelledError:
            # cancelled from the UI, the CLI or a client: its trajectories end with it (a terminated run's are ended
            # by the orchestrator's sweep, workers/run_sweep.py)
            admission.cancel()
            self._upsert_status("cancelled")
            await self._cancel_leftovers()
            raise
        finally:
            admission.cancel()
        await self._cancel_leftovers()
        stopping = self.s.stopping
        stopped = None
        if stopping is not None and self.s.version < cfg.steps:
            stopped = f"{stopping.reason} at v{self.s.version} ({'now' if stopping.now else 'graceful'})"
        self._upsert_status("stopped" if stopped else "done")
        return TrainingResult(
            run_id=self.s.run_id,
            version=self.s.version,
            counters=self.s.counters,
            history=self.s.history,
            wall_seconds=workflow.time() - self.s.started_at,
            by_task=self.s.by_task,
            stopped=stopped,
        )

    async def _admission_loop(self) -> None:
        """Start groups whenever the staleness budget allows, and cancel redundant samples no longer needed."""
        book = self.book
        while True:
            await workflow.wait_condition(lambda: self.rules.has_work(self.pause_admission))
            self.admitting = True
            try:
                await members.send_cancels(self.book)
                if self.shards is not None:
                    while (start := self.shards.next_shard(self.pause_admission)) is not None:
                        await sharding.start_shard(self.shards, start)
                    continue
                while (replacement := book.next_replacement(self.pause_admission)) is not None:
                    group, missing = replacement
                    await asyncio.gather(*(self._start_member(group) for _ in range(missing)))
                while (branch := book.next_branch(self.pause_admission)) is not None:
                    await self._start_member(*branch)  # tree rollouts (workflows.trees)
                for _ in range(book.groups_to_admit(self.pause_admission)):
                    group = book.new_group()
                    # the group's starts go out in one workflow activation, not one round trip each
                    await asyncio.gather(*(self._start_member(group) for _ in range(trees.starts(self.cfg))))
            finally:
                self.admitting = False

    async def _start_member(self, group: GroupState, branch: BranchPlan | None = None) -> None:
        wid, handle = await members.start_member(self.book, self.cfg, group, self.s.run_id, self.s.version, branch)
        asyncio.create_task(self._watch(handle, wid))

    async def _watch(self, handle: workflow.ChildWorkflowHandle, wid: str) -> None:
        """A child this run started: its result, or how it ended, once it closed."""
        try:
            result: TrajectoryResult | None = await handle
            self._ended(wid, result, "completed")
        except ChildWorkflowError as e:
            self._ended(wid, None, str(e))

    async def _watch_inherited(self, wids: list[str]) -> None:
        """Children a previous run started (their handles died with it): watched by an activity until each has
        reported or closed."""
        while wids := [w for w in wids if self.book.is_running(w)]:
            res = await stubs.watch_children(WatchChildrenInput(workflow_ids=wids))
            for child in res.closed:
                self._ended(child.workflow_id, child.result, child.status)

    def _ended(self, wid: str, result: TrajectoryResult | None, how: str) -> None:
        """A child closed: file its report in its place if it never arrived."""
        report = self.book.ended_unreported(wid, result)
        if report is not None:
            workflow.logger.warning("trajectory %s closed (%s) without its report arriving", wid, how)
            self.trajectory_finished(report)

    async def _wait_for_batch(self) -> TrainStepInput | None:
        """Wait until B/n complete, fresh groups are ready; drop stale ones on the way (hard bound). None when
        the workflow should continue as new first, or a stop leaves no step to train."""
        rules = self.rules
        while True:
            dropped = [g.group for g in rules.drop_stale()] if isinstance(rules, Book) else rules.drop_stale()
            if dropped:
                workflow.logger.info(
                    "dropping %d stale groups (trainer v%d): %s", len(dropped), self.s.version, ", ".join(dropped[:8])
                )
            step = rules.take_batch()
            if step is not None or self._should_continue() or rules.stop_due():
                return step
            await workflow.wait_condition(
                lambda: rules.batch_may_be_ready() or self._should_continue() or rules.stop_due()
            )

    async def _train(self, step: TrainStepInput) -> bool:
        """Train `step` (the state records it as in flight); False when the workflow should continue as new
        before the trainer answered (the next run issues the step again)."""
        call = asyncio.create_task(stubs.train_step(self.cfg.trainer_pool, step))
        await workflow.wait_condition(lambda: call.done() or self._should_continue())
        if not call.done():
            return False
        # the samples' staleness is observed by the trainer (`activities/trainer.py`): no per-sample call here
        self.rules.finish_step(step, call.result(), workflow.time() - self.s.started_at)
        workflow.upsert_search_attributes([keys.SA_VERSION.value_set(self.s.version)])
        return True

    # --- reports -------------------------------------------------------------------------------------------

    @workflow.signal(name=names.SIGNAL_TRAJECTORY_FINISHED)
    def trajectory_finished(self, report: TrajectoryReport) -> None:
        self._reported()
        self._after(report, self.book.report(report))

    def _reported(self) -> None:
        """Count a report; at the budget, continue as new before Temporal refuses this run's signals."""
        self.reports += 1
        if self.reports == capacity.REPORTS_BEFORE_CONTINUE and workflow.patched(PATCH_REPORT_BUDGET):
            workflow.logger.info("run %s: %d reports in this run, continuing as new", self.s.run_id, self.reports)
            self.continue_requested = True

    @workflow.signal(name=names.SIGNAL_GROUP_FINISHED)
    def group_finished(self, report: GroupReport) -> None:
        """A shard's report of one of its groups (a sharded run)."""
        self._reported()
        if self.shards is None:
            workflow.logger.warning("group report from %s ignored: run %s is not sharded", report.shard, self.s.run_id)
            return
        outcome = self.shards.group_report(report)
        if not report.ready and outcome.counted:
            workflow.logger.warning("abandoning group g%06d of %s: its members failed", report.k, report.shard)
        self._after(None, outcome)

    @workflow.signal(name=names.SIGNAL_SHARD_FINISHED)
    def shard_finished(self, done: ShardDone) -> None:
        """A shard's last message: every group of it reported."""
        self._reported()
        if self.shards is not None:
            self.shards.shard_done(done)

    def _after(self, report: TrajectoryReport | None, outcome: ReportOutcome) -> None:
        """Log and publish what a report changed (the bookkeeping already did it in the state)."""
        s = self.s
        if outcome.resumed:
            self._log_resumed(outcome.resumed)
        if outcome.paused:
            self._upsert_status("paused")
            workflow.logger.error(
                "ADMISSION PAUSED for run %s: %s. A probe group is admitted every so often; a completed "
                "trajectory, or the %r signal, resumes admission.",
                s.run_id,
                s.paused,
                names.SIGNAL_RESUME_ADMISSION,
            )
            self._start_prober()
        if outcome.abandoned is not None:
            g = outcome.abandoned
            workflow.logger.warning("abandoning group %s: %d members failed", g.group, g.failed)
        if outcome.flat is not None:
            workflow.logger.info("group %s is flat (rewards all equal): %s", outcome.flat_group, outcome.flat)
            if outcome.flat == "dropped" and s.flat_dropped_step >= self.cfg.max_flat_groups_per_step:
                workflow.logger.warning(
                    "run %s dropped %d flat groups since v%d: flat groups are trained on until the next step",
                    s.run_id,
                    s.flat_dropped_step,
                    s.version,
                )

    def _start_prober(self) -> None:
        if self.prober is None or self.prober.done():
            self.prober = asyncio.create_task(self._probe_while_paused())

    async def _probe_while_paused(self) -> None:
        """Half-open: admit one probe group after `pause_probe_s`, then after twice that (up to 10 min), until
        admission resumes."""
        while self.s.paused:
            delay = self.s.probe_delay_s or self.cfg.pause_probe_s
            try:
                await workflow.wait_condition(lambda: not self.s.paused, timeout=delay)
            except TimeoutError:
                workflow.logger.warning("admission paused for run %s: admitting a probe group", self.s.run_id)
                self.book.probe_now()

    @workflow.signal(name=names.SIGNAL_STOP)
    def stop(self, request: StopRequest) -> None:
        """End the run early (`StopRequest`): graceful, or `now`."""
        if self.rules.stop(request):
            stopping = self.s.stopping
            assert stopping is not None
            workflow.logger.warning(
                "run %s stopping (%s, %s): it ends at v%d",
                self.s.run_id,
                stopping.reason,
                "now" if stopping.now else "graceful",
                stopping.at_version,
            )
            self._upsert_status("stopping")

    @workflow.signal(name=names.SIGNAL_RESUME_ADMISSION)
    def resume_admission(self) -> None:
        """Resume admission now (after fixing what made trajectories fail on infrastructure)."""
        if self.s.paused:
            self.book.resume()
            self._log_resumed("resumed by signal")

    def _log_resumed(self, why: str) -> None:
        workflow.logger.warning("admission resumed for run %s: %s", self.s.run_id, why)
        self._upsert_status("training")

    # --- state you can look at -------------------------------------------------------------------------------

    @workflow.query(name=names.QUERY_PROGRESS)
    def progress(self) -> TrainingProgress:
        return queries.progress(self.cfg, self.s, elapsed_s=workflow.time() - self.s.started_at)

    @workflow.query(name=names.QUERY_RUN_CONFIG)
    def run_config(self) -> TrainingRunConfig:
        return self.cfg

    @workflow.query(name=names.QUERY_STATE)
    def state(self) -> TrainingState:
        return self.s

    # --- housekeeping ----------------------------------------------------------------------------------------

    @workflow.signal(name=names.SIGNAL_CONTINUE_AS_NEW)
    def continue_as_new(self) -> None:
        """Continue as new at the next waiting point, whatever the loop is doing (an operator's tool: e.g. before
        workers with changed workflow code take over, so the run's history holds only the new code's commands)."""
        self.continue_requested = True

    def _should_continue(self) -> bool:
        """Asked for by signal, or the history is long; checked at every point where the loop waits."""
        info = workflow.info()
        return (
            self.continue_requested
            or info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self.cfg.history_events_before_continue
        )

    async def _continue_as_new(self, admission: asyncio.Task[None]) -> None:
        """Carry the whole state over: queued cancellations and replacements, the probe, the step in flight."""
        self.pause_admission = True
        await workflow.wait_condition(lambda: not self.admitting and workflow.all_handlers_finished())
        admission.cancel()
        self.s.continued += 1
        workflow.continue_as_new(TrainingStart(run=self.cfg, resume=self.s))

    async def _cancel_leftovers(self) -> None:
        self.rules.cancel_leftovers()
        await members.send_cancels(self.book)
        if (shards := self.shards) is not None and shards.sh.shards and workflow.patched(PATCH_WAIT_FOR_SHARDS):
            # the shards' last messages count the members they cancel; a shard that never answers (terminated, its
            # worker gone) is waited for no longer than SHARDS_CLOSE_S, and its members are counted by none
            try:
                await workflow.wait_condition(lambda: not shards.sh.shards, timeout=SHARDS_CLOSE_S)
            except TimeoutError:
                workflow.logger.warning("%d shards sent no last message", len(shards.sh.shards))

    def _upsert_status(self, status: str) -> None:
        workflow.upsert_search_attributes([keys.SA_RUN.value_set(self.s.run_id), keys.SA_STATUS.value_set(status)])
