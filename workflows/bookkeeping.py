"""The TrainingWorkflow's bookkeeping, pure: admission budget, groups, replacements, task choice, reports,
stale dropping, batches. No Temporal here (stdlib and `contracts` only), so every rule is unit-tested without a
server; the workflow (workflows/training.py) does the side effects — starting and cancelling children, the train
step, timers, search attributes, logging — and asks this module what to do.

`Book` works on the workflow's `TrainingState` in place. Methods that the workflow must react to return what
happened (a `ReportOutcome`, the groups dropped) instead of logging or signalling themselves.

Bounded: the state holds the open groups (bounded by admission), the queues, the last HISTORY_KEPT step records
and digests of the last EXTERNAL_CLOSED_KEPT closed user-started groups; closed groups of the workflow's own are
known by name. The admission pause after a run of infra failures is `trajflow.workflows.pause`. Limits: one `Book` per
workflow run; it trusts the state it is given (written by itself).
"""

from __future__ import annotations

import hashlib
import re

from trajflow.contracts.rollouts import BranchPlan
from trajflow.contracts.steps import lag_histogram
from trajflow.contracts.training import (
    GroupState,
    StepRecord,
    StopRequest,
    TaskStats,
    TrainingRunConfig,
    TrainingState,
    TrainRef,
    TrainStepInput,
    TrainStepResult,
)
from trajflow.contracts.trajectory import TrajectoryReport, TrajectoryResult, TrajectoryStatus
from trajflow.workflows import admission, flat, pause, tasks, trees
from trajflow.workflows.pause import ReportOutcome

HISTORY_KEPT = 200
"""Step records kept in workflow state; the trainer also writes every step's record to the store."""
EXTERNAL_CLOSED_KEPT = 1024
"""Closed user-started groups remembered (as 16-character digests: bounded whatever their names). A report for
an older one is taken as the first of a new external group of that name (counted `external`); it is trained
only if n samples of it arrive again and are fresh, and dropped as stale otherwise."""
OWN_GROUP = re.compile(r"g\d{6,}")
"""The names of the groups the workflow starts (`g{k:06d}`); reserved: a user-started trajectory must not use them."""


class Book:
    """The loop's rules over one `TrainingState` (see the module docstring)."""

    def __init__(self, cfg: TrainingRunConfig, state: TrainingState) -> None:
        self.cfg = cfg
        self.s = state
        self.to_cancel = state.to_cancel
        """Workflow ids of members to cancel (the workflow sends the cancellations)."""
        self.replacements = state.replacements
        """Group -> replacement samples to start for groups whose members failed."""

    @property
    def training(self) -> bool:
        """True while a step is being trained."""
        return self.s.step is not None

    @property
    def probe(self) -> bool:
        return self.s.probe

    @probe.setter
    def probe(self, value: bool) -> None:
        self.s.probe = value

    # --- admission -----------------------------------------------------------------------------------------

    def may_replace(self, pause_admission: bool = False) -> bool:
        """Replacements for failed members wait while admission is paused (they would fail the same way), but
        for a probe: the groups waiting for them hold the staleness budget, so a probe is a replacement first."""
        return not pause_admission and self.s.stopping is None and (not self.s.paused or self.probe)

    def groups_to_admit(self, pause_admission: bool = False) -> int:
        """The α budget (`trajflow.workflows.admission`) over the workflow's own open groups."""
        open_groups = len(self.open_groups())
        return admission.groups_to_admit(
            self.cfg, self.s, open_groups=open_groups, training=self.training, pause_admission=pause_admission
        )

    def running(self) -> int:
        return self.cfg.group_size * len(self.open_groups())

    def open_groups(self) -> list[GroupState]:
        """The groups the workflow admitted that are not yet trained on, dropped or abandoned."""
        return [g for g in self.s.groups.values() if not g.external]

    def new_group(self) -> GroupState:
        """Admit the next group: its seed, its task, registered as open (its members are started next)."""
        cfg, s = self.cfg, self.s
        k = s.next_group
        s.next_group += 1
        self.probe = False
        name, task = f"g{k:06d}", self.pick_task(k)
        group = GroupState(
            group=name, seed=cfg.first_seed + k, task=task, started_version=s.version, tree=trees.new_tree(cfg)
        )
        s.groups[group.group] = group
        return group

    def pick_task(self, k: int) -> int:
        """The task of the run's k-th group (`trajflow.workflows.tasks.pick`: weighted round robin), counted as
        started."""
        return tasks.pick(self.cfg, self.s, k)

    def new_member(self, group: GroupState) -> str:
        """The workflow id of the group's next member, marked running before its start is confirmed: when the
        workflow's tasks are delayed, a short child can finish and report in the activation that confirms its
        start, and signals are handled first; a report from a member not yet running would be dropped as late."""
        wid = f"{self.s.run_id}-{group.group}-{group.members_started}"
        group.members_started += 1
        group.running.append(wid)
        return wid

    def member_not_started(self, group: GroupState, wid: str) -> None:
        group.running.remove(wid)

    def member_started(self) -> None:
        c = self.s.counters
        c.started += 1
        c.max_in_flight = max(c.max_in_flight, sum(len(g.running) for g in self.s.groups.values()))

    def next_replacement(self, pause_admission: bool = False) -> tuple[GroupState, int] | None:
        """The next queued (group, members to start) replacement that may go now, if any."""
        while self.replacements and self.may_replace(pause_admission):
            key = next(iter(self.replacements))
            missing = self.replacements.pop(key)
            if self.s.paused:
                self.probe = False  # the probe is this group's replacement members
            if key in self.s.groups:
                return self.s.groups[key], missing
        return None

    def next_branch(self, pause_admission: bool = False) -> tuple[GroupState, BranchPlan] | None:
        """Tree rollouts: the next queued branch (`trajflow.workflows.trees`), taken off its group's queue; they go when
        replacements may, but not as a probe."""
        return trees.next_branch(self.s) if self.may_replace(pause_admission) and not self.s.paused else None

    def has_work(self, pause_admission: bool = False) -> bool:
        """Something for the admission loop: cancellations, replacements or branches that may go, groups to admit."""
        return (
            bool(self.to_cancel)
            or (bool(self.replacements) and self.may_replace(pause_admission))
            or (trees.queued(self.s) and self.may_replace(pause_admission) and not self.s.paused)
            or self.groups_to_admit(pause_admission) > 0
        )

    # --- batches -------------------------------------------------------------------------------------------

    def members_running(self) -> bool:
        return any(g.running for g in self.s.groups.values())

    def ready_groups(self) -> list[GroupState]:
        n = self.cfg.group_size
        return [g for g in self.s.groups.values() if len(g.completed) >= n]

    def is_stale(self, g: GroupState) -> bool:
        return admission.is_stale(self.cfg, self.s, min(r.policy_version for r in g.completed))

    def drop_stale(self) -> list[GroupState]:
        """Close the ready groups too stale to train on (the hard bound); returns them."""
        stale = [g for g in self.ready_groups() if self.is_stale(g)]
        for g in stale:
            self.s.counters.dropped_stale += len(g.completed)
            self.close_group(g)
        return stale

    def batch_may_be_ready(self) -> bool:
        """True when a batch can be taken, or stale groups wait to be dropped (the workflow then re-checks)."""
        if self.cfg.sync and self.members_running():
            return False
        ready = self.ready_groups()
        return len(ready) >= self.groups_per_step() or any(self.is_stale(g) for g in ready)

    def groups_per_step(self) -> int:
        return self.cfg.batch_size // self.cfg.group_size

    def take_batch(self) -> TrainStepInput | None:
        """After `drop_stale`: the next step's input (recorded as the step in flight), its groups closed and
        consumed; None if none is ready."""
        cfg, s = self.cfg, self.s
        ready = self.ready_groups()
        if len(ready) < self.groups_per_step() or (cfg.sync and self.members_running()):
            return None
        groups = ready[: self.groups_per_step()]
        # each group's samples in member order, not in the order they happened to finish, so the same batch reaches
        # the trainer in the same order in every run of a seed (a group's ids differ in their index only)
        refs = [r for g in groups for r in sorted(g.completed[: cfg.group_size], key=_member_order)]
        for g in groups:
            self.close_group(g)
        s.counters.consumed += len(refs)
        trainer = cfg.trainer.model_copy(update={"seed": cfg.seed})
        s.step = TrainStepInput(run_id=s.run_id, version=s.version, refs=refs, trainer=trainer)
        return s.step

    def finish_step(self, step: TrainStepInput, res: TrainStepResult, time_s: float) -> StepRecord:
        """The trainer took `step`: the new version and its record (`time_s`: since the run started)."""
        s, refs, per_task = self.s, step.refs, TaskStats.of(step.refs)
        s.version, s.step = res.version, None
        record = StepRecord(
            step=res.version,
            time_s=time_s,
            reward_mean=sum(r.reward for r in refs) / len(refs),
            trajectories=len(refs),
            stale_dropped_total=s.counters.dropped_stale,
            staleness=lag_histogram(step.version - r.policy_version for r in refs),
            metrics=res.metrics,
            train_s=res.seconds,
            wins=sum(r.won for r in refs),
            flat_groups_dropped=flat.step_done(s),
            by_task=per_task if len(self.cfg.tasks) > 1 else {},
        )
        for name, stats in per_task.items():
            s.by_task[name] = s.by_task.get(name, TaskStats()).plus(stats)
        s.history.append(record)
        del s.history[:-HISTORY_KEPT]
        return record

    def cancel_running(self, g: GroupState) -> None:
        """Queue the group's running members for cancellation (the admission loop sends it) and count them."""
        self.to_cancel.extend(g.running)
        self.s.counters.cancelled += len(g.running)
        g.running = []

    def close_group(self, g: GroupState) -> None:
        """The group leaves the pipeline (trained, dropped or abandoned); its running members are cancelled."""
        self.cancel_running(g)
        self.s.groups.pop(g.group, None)
        if g.external:
            self.s.closed_external.append(_digest(g.group))
            del self.s.closed_external[:-EXTERNAL_CLOSED_KEPT]

    def is_closed(self, key: str) -> bool:
        """A group that is not open and was closed (or, with one of the workflow's own names, never open)."""
        if OWN_GROUP.fullmatch(key):
            return True  # the workflow's groups stay open from their start until they close, and never reopen
        return _digest(key) in self.s.closed_external

    def cancel_leftovers(self) -> None:
        for g in list(self.s.groups.values()):
            self.cancel_running(g)

    # --- stopping ------------------------------------------------------------------------------------------

    def stop(self, request: StopRequest) -> bool:
        """Record a stop (the first, or `now` after a graceful one; True if it changed anything) and the version
        the run ends at: graceful, after the current step; now, after a step the trainer already has, if any.
        `now` queues every running member for cancellation; admission and replacements end either way."""
        s = self.s
        if s.stopping is not None and (s.stopping.now or not request.now):
            return False
        at = s.version + 1 if (self.training or not request.now) else s.version
        s.stopping = request.model_copy(update={"at_version": min(at, self.cfg.steps)})
        if request.now:
            self.cancel_leftovers()
        self.replacements.clear()
        return True

    def stop_due(self) -> bool:
        """A stop was asked for and no further step will be trained: the run reached the version it ends at, or no
        step is being trained and (now) nothing more is wanted or (graceful) the groups still open cannot fill a
        batch without admission or replacements."""
        s, stopping = self.s, self.s.stopping
        if stopping is None:
            return False
        if s.version >= stopping.at_version:
            return True
        if self.training:
            return False
        n = self.cfg.group_size
        fillable = [g for g in self.open_groups() if len(g.completed) + len(g.running) >= n]
        return stopping.now or len(fillable) < self.groups_per_step()

    # --- reports -------------------------------------------------------------------------------------------

    def running_members(self) -> list[str]:
        """Members of the workflow's groups still expected to report (what a new run inherits and watches)."""
        return [wid for g in self.open_groups() for wid in g.running]

    def is_running(self, wid: str) -> bool:
        return any(wid in g.running for g in self.open_groups())

    def ended_unreported(self, wid: str, result: TrajectoryResult | None) -> TrajectoryReport | None:
        """A member closed and its report has not arrived: the report to file in its place (None when it is no
        longer expected: reported, or cancelled by us). From its result when it completed (the signal was
        lost); otherwise (terminated, failed, timed out, never started) an infra failure, never scored."""
        group = wid[len(self.s.run_id) + 1 :].rsplit("-", 1)[0]  # ids are f"{run_id}-{group}-{index}"
        g = self.s.groups.get(group)
        if g is None or wid not in g.running:
            return None
        if result is not None:
            return result.report(group)
        return TrajectoryReport.infra_failed(wid, group, "ended without a report")

    def report(self, report: TrajectoryReport) -> ReportOutcome:
        """A trajectory ended (its signal, or its result when the signal was lost): count it, file it in its
        group, and decide what follows (cancel the redundant rest, replace failed members, pause or resume)."""
        s, c = self.s, self.s.counters
        key = report.group or f"user-{report.workflow_id}"
        g = s.groups.get(key)
        if g is None and self.is_closed(key):
            c.late += 1  # its group was already trained on, dropped or abandoned
            return ReportOutcome()
        if g is None:
            g = GroupState(group=key, seed=-1, task=-1, started_version=report.policy_version or 0, external=True)
            s.groups[key] = g
        if report.workflow_id in [r.workflow_id for r in g.completed]:
            c.duplicates += 1
            return ReportOutcome()
        if g.external:
            c.external += 1
        elif report.workflow_id not in g.running:
            c.late += 1  # a redundant sample of a full group that ended before its cancellation landed
            return ReportOutcome()
        else:
            g.running.remove(report.workflow_id)
        outcome = pause.count(self.s, self.cfg, report)
        if report.status is TrajectoryStatus.COMPLETED and report.reward is not None and report.trajectory_uri:
            g.completed.append(
                TrainRef(
                    workflow_id=report.workflow_id,
                    trajectory_uri=report.trajectory_uri,
                    group=key,
                    reward=report.reward,
                    policy_version=report.policy_version or 0,
                    task=self.cfg.tasks[g.task].name if g.task >= 0 else "external",
                    won=report.won,
                )
            )
        else:
            g.failed += 1
        outcome.abandoned = self._after_report(g, outcome, report)
        return outcome

    def resume(self) -> None:
        pause.resume(self.s)

    def probe_now(self) -> float:
        """While paused, a probe is due: admit one, and return how long to wait before the next."""
        return pause.probe_now(self.s, self.cfg)

    def _after_report(self, g: GroupState, outcome: ReportOutcome, report: TrajectoryReport) -> GroupState | None:
        """Cancel the redundant rest of a full group (dropped when flat: `trajflow.workflows.flat`), or queue
        replacements for failed members, or abandon the group past its restart budget (returned)."""
        n = self.cfg.group_size
        if len(g.completed) >= n:
            g.completed = g.completed[:n]
            self.cancel_running(g)  # the group is full: redundant samples are not needed
            rewards_flat = not g.external and flat.group_is_flat(self.cfg, (r.reward for r in g.completed))
            if verdict := flat.verdict(self.s, self.cfg, rewards_flat):
                outcome.flat, outcome.flat_group = verdict, g.group
                if verdict == "dropped":
                    self.close_group(g)  # admission starts a new group in its place
            return None
        if g.tree is not None:  # tree rollouts: a root's branches, or a failed member's replacement, queued at once
            abandon = trees.after_report(self.cfg, g, report, self.replacements)
        elif g.external or g.running:
            return None
        else:  # members failed and none is left running: replace them, within the group's restart budget
            missing = n - len(g.completed)
            restarts_used = g.members_started - (n + self.cfg.redundancy)
            abandon = restarts_used + missing > self.cfg.max_group_restarts
            if not abandon:
                self.replacements[g.group] = missing
        if abandon:
            self.s.counters.groups_abandoned += 1
            self.close_group(g)
            return g
        return None


def _member_order(ref: TrainRef) -> tuple[int, str]:
    return len(ref.workflow_id), ref.workflow_id


def _digest(group: str) -> str:
    return hashlib.blake2b(group.encode(), digest_size=8).hexdigest()
