"""The TrainingWorkflow's bookkeeping in a sharded run (`[train] groups_per_shard`), pure: admission in whole shards,
group reports, stale dropping and batches over ranges of group indices. Like `trajflow.workflows.bookkeeping` (whose
`Book` it keeps for the rules both modes share: the task choice, stopping, user-started trajectories), no Temporal here.

The state it works on is `TrainingState.sharded` (`ShardedState`): the groups admitted and not yet reported
(`open`), the complete ones by their oldest policy version (`ready`), the live shards. A group's samples never reach
the training workflow: its shard writes them to the store (`GroupManifest`) and reports one `GroupReport`; a step's
input names its groups by index ranges and the trainer reads their manifests. So the state grows with the number
of *fragments* of the group ranges, not with trajectories (docs/capacity.md measures it).

Admission pause in a sharded run: a shard reports a group once it ends, so the infra-failure streak counts failed
members per group report (a group that completed any member resets it) instead of per trajectory.
"""

from __future__ import annotations

from trajflow.contracts.shards import (
    GroupCounts,
    GroupReport,
    GroupSpec,
    IndexSet,
    ShardDone,
    ShardedState,
    group_name,
    shard_id,
)
from trajflow.contracts.steps import StepRecord, TaskStats
from trajflow.contracts.training import (
    ShardStart,
    StopRequest,
    TrainingRunConfig,
    TrainingState,
    TrainStepInput,
    TrainStepResult,
)
from trajflow.workflows import admission, flat, pause
from trajflow.workflows.bookkeeping import HISTORY_KEPT, Book, _member_order
from trajflow.workflows.pause import ReportOutcome


class ShardBook:
    """The sharded run's rules over one `TrainingState` (see the module docstring)."""

    def __init__(self, cfg: TrainingRunConfig, state: TrainingState) -> None:
        self.cfg = cfg
        self.s = state
        if state.sharded is None:
            state.sharded = ShardedState()
        self.sh: ShardedState = state.sharded
        self.book = Book(cfg, state)
        """The rules shared with direct runs, and the groups of user-started trajectories (`state.groups`)."""
        self.to_cancel = state.to_cancel
        """Workflow ids to cancel: shards (their members end with them) and user-started trajectories."""

    @property
    def training(self) -> bool:
        return self.s.step is not None

    # --- admission -------------------------------------------------------------------------------------------

    def in_pipeline(self) -> int:
        """The run's own groups admitted and not yet trained on, dropped or abandoned (open or ready)."""
        return len(self.sh.open) + sum(len(v) for v in self.sh.ready.values())

    def groups_to_admit(self, pause_admission: bool = False) -> int:
        """The α budget (`trajflow.workflows.admission`) over the groups of the pipeline (a shard's are counted
        from its start, not its members)."""
        return admission.groups_to_admit(
            self.cfg, self.s, open_groups=self.in_pipeline(), training=self.training, pause_admission=pause_admission
        )

    def shard_due(self, pause_admission: bool = False) -> int:
        """The groups of the next shard to start now (0: none). Shards are full (`shard_size` groups) but at the end
        of the run, in sync mode and for a probe: a budget smaller than a shard waits for the next step, so the
        shards in flight stay within `max_shards_in_flight`."""
        cfg, s = self.cfg, self.s
        groups = self.groups_to_admit(pause_admission)
        if groups <= 0:
            return 0
        full = cfg.shard_size()
        left = cfg.steps * cfg.batch_size - s.counters.consumed - cfg.group_size * self.in_pipeline()
        # flat groups dropped (`filter_flat_groups`) may leave fewer groups than a step needs and a budget below a
        # shard: waiting for a full one would wait forever
        starved = cfg.filter_flat_groups and self.in_pipeline() < self.book.groups_per_step()
        if groups < full and not (cfg.sync or s.paused or starved or left <= full * cfg.group_size):
            return 0
        return min(groups, full)

    def next_shard(self, pause_admission: bool = False) -> ShardStart | None:
        """Admit the next shard's groups (open from now on) and return its start, or None (`shard_due`)."""
        cfg, s = self.cfg, self.s
        size = self.shard_due(pause_admission)
        if not size:
            return None
        specs = []
        for _ in range(size):
            k = s.next_group
            s.next_group += 1
            specs.append(GroupSpec(k=k, seed=cfg.first_seed + k, task=self.book.pick_task(k)))
            self.sh.open.add(k)
        s.probe = False
        first = specs[0].k
        self.sh.shards.add(first)
        self.sh.shard_sizes[first] = len(specs)
        return ShardStart(run=cfg, run_id=s.run_id, groups=specs, min_policy_version=s.version)

    def has_work(self, pause_admission: bool = False) -> bool:
        """Something for the admission loop: cancellations, or a shard due."""
        return bool(self.to_cancel) or self.shard_due(pause_admission) > 0

    def shard_started(self) -> None:
        """A shard's start was confirmed: the most trajectories in flight so far, as its open groups bound them."""
        c, per_group = self.s.counters, self.cfg.group_size + self.cfg.redundancy
        c.max_in_flight = max(c.max_in_flight, per_group * len(self.sh.open))

    def shard_not_started(self, start: ShardStart) -> None:
        """Starting the shard failed: its groups were never run (forget them as admitted)."""
        for spec in start.groups:
            self.sh.open.remove(spec.k)
        self._forget_shard(start.groups[0].k)

    def live_shards(self) -> list[str]:
        """The workflow ids of the shards not known to have closed (what a new run inherits and watches)."""
        return [shard_id(self.s.run_id, first) for first in self.sh.shards]

    def is_live(self, wid: str) -> bool:
        first = _shard_first(self.s.run_id, wid)
        return first is not None and first in self.sh.shards

    # --- reports ---------------------------------------------------------------------------------------------

    def group_report(self, report: GroupReport) -> ReportOutcome:
        """A shard's report of one group: count it and file the group as ready or abandoned."""
        if not self.sh.open.remove(report.k):
            self.s.counters.late += 1  # a repeated report (its shard was retried), or of a group already written off
            return ReportOutcome()
        outcome = self._count(report.counts, report.last_error, report.shard)
        if report.ready and (verdict := flat.verdict(self.s, self.cfg, report.flat)):
            outcome.flat, outcome.flat_group = verdict, group_name(report.k)  # the shard found it flat
            if verdict == "dropped":
                return outcome  # never ready: admission starts a new group in its place
        if report.ready:
            self.sh.ready.setdefault(report.oldest_version, IndexSet()).add(report.k)
        else:
            self.s.counters.groups_abandoned += 1
        return outcome

    def shard_done(self, done: ShardDone) -> None:
        """A shard's last message: its late counts; it is closed."""
        self._add(done.counts)
        self.shard_closed(done.shard)

    def shard_closed(self, wid: str) -> list[int]:
        """The shard `wid` closed (its last message, or its watcher saw it end): its groups that never reported are
        abandoned as infrastructure failures of theirs (returned)."""
        first = _shard_first(self.s.run_id, wid)
        if first is None or first not in self.sh.shards:
            return []
        size = self.sh.shard_sizes.get(first, 0)
        lost = [k for k in range(first, first + size) if self.sh.open.remove(k)]
        self.s.counters.groups_abandoned += len(lost)
        self._forget_shard(first)
        return lost

    def _forget_shard(self, first: int) -> None:
        self.sh.shards.remove(first)
        self.sh.shard_sizes.pop(first, None)

    def _count(self, counts: GroupCounts, last_error: str | None, shard: str) -> ReportOutcome:
        """Add a group's counts and run the admission pause on them (`trajflow.workflows.pause`, per group)."""
        s, cfg = self.s, self.cfg
        self._add(counts)
        outcome = ReportOutcome(counted=True)
        if counts.completed or counts.failed:
            s.infra_streak = 0
            if s.paused:
                outcome.resumed = f"a group of {shard} completed: the infrastructure works again"
                pause.resume(s)
            return outcome
        if not counts.infra_failed:
            return outcome
        s.infra_streak += counts.infra_failed
        if not s.paused and s.infra_streak >= cfg.pause_after_infra_failures:
            s.paused = (
                f"{s.infra_streak} trajectories in a row failed on infrastructure, the last of {shard} with: "
                f"{last_error or 'no error recorded'}"
            )
            s.counters.admission_pauses += 1
            outcome.paused = True
        return outcome

    def _add(self, counts: GroupCounts) -> None:
        c = self.s.counters
        for name in GroupCounts.model_fields:
            setattr(c, name, getattr(c, name) + getattr(counts, name))

    # --- batches ---------------------------------------------------------------------------------------------

    def ready_count(self) -> int:
        return sum(len(v) for v in self.sh.ready.values()) + len(self.book.ready_groups())

    def drop_stale(self) -> list[str]:
        """Drop the ready groups too stale to train on (the hard bound), user-started ones with them; returns their
        names."""
        floor = admission.staleness_floor(self.cfg, self.s)
        dropped: list[str] = []
        for version in [v for v in self.sh.ready if v < floor]:
            stale = self.sh.ready.pop(version)
            self.s.counters.dropped_stale += len(stale) * self.cfg.group_size
            dropped.extend(group_name(k) for k in stale)
        return dropped + [g.group for g in self.book.drop_stale()]

    def batch_may_be_ready(self) -> bool:
        if self.cfg.sync and (self.sh.open or self.book.members_running()):
            return False
        floor = admission.staleness_floor(self.cfg, self.s)
        return (
            self.ready_count() >= self.book.groups_per_step()
            or any(v < floor for v in self.sh.ready)
            or any(self.book.is_stale(g) for g in self.book.ready_groups())
        )

    def take_batch(self) -> TrainStepInput | None:
        """After `drop_stale`: the next step (user-started groups first, then the lowest group indices), recorded as
        the step in flight; None if none is ready."""
        cfg, s = self.cfg, self.s
        per_step = self.book.groups_per_step()
        if self.ready_count() < per_step or (cfg.sync and (self.sh.open or self.book.members_running())):
            return None
        external = self.book.ready_groups()[:per_step]
        refs = [r for g in external for r in sorted(g.completed[: cfg.group_size], key=_member_order)]
        for g in external:
            self.book.close_group(g)
        ready = IndexSet.of(k for v in self.sh.ready.values() for k in v)
        taken = ready.lowest(per_step - len(external))
        for version in list(self.sh.ready):
            for k in taken:
                self.sh.ready[version].remove(k)
            if not self.sh.ready[version]:
                del self.sh.ready[version]
        s.counters.consumed += len(refs) + len(taken) * cfg.group_size
        trainer = cfg.trainer.model_copy(update={"seed": cfg.seed})
        s.step = TrainStepInput(
            run_id=s.run_id, version=s.version, refs=refs, trainer=trainer, groups=IndexSet.of(taken).ranges
        )
        return s.step

    def finish_step(self, step: TrainStepInput, res: TrainStepResult, time_s: float) -> StepRecord:
        """The trainer took `step`: the new version and its record, made of the trainer's batch figures."""
        s, batch = self.s, res.batch
        s.version, s.step = res.version, None
        trained = len(step.refs) + sum(end - start for start, end in step.groups) * self.cfg.group_size
        record = StepRecord(
            step=res.version,
            time_s=time_s,
            reward_mean=batch.reward_mean if batch else 0.0,
            trajectories=batch.trajectories if batch else trained,
            stale_dropped_total=s.counters.dropped_stale,
            staleness=batch.staleness if batch else {},
            metrics=res.metrics,
            train_s=res.seconds,
            wins=batch.wins if batch else 0,
            flat_groups_dropped=flat.step_done(s),
            by_task=(batch.by_task if batch else {}) if len(self.cfg.tasks) > 1 else {},
        )
        for name, stats in (batch.by_task if batch else {}).items():
            s.by_task[name] = s.by_task.get(name, TaskStats()).plus(stats)
        s.history.append(record)
        del s.history[:-HISTORY_KEPT]
        return record

    # --- stopping --------------------------------------------------------------------------------------------

    def stop(self, request: StopRequest) -> bool:
        """`Book.stop`; `now` also queues every live shard for cancellation."""
        changed = self.book.stop(request)
        if changed and request.now:
            self.cancel_leftovers()
        return changed

    def stop_due(self) -> bool:
        """`Book.stop_due` over the sharded groups: an open group is taken as one that can still complete."""
        s, stopping = self.s, self.s.stopping
        if stopping is None:
            return False
        if s.version >= stopping.at_version:
            return True
        if self.training:
            return False
        return stopping.now or self.in_pipeline() < self.book.groups_per_step()

    def cancel_leftovers(self) -> None:
        """Queue every live shard and running user-started trajectory for cancellation; their groups are written
        off (what the shards still report is counted late)."""
        for wid in self.live_shards():
            if wid not in self.to_cancel:
                self.to_cancel.append(wid)
        self.book.cancel_leftovers()


def _shard_first(run_id: str, wid: str) -> int | None:
    """The first group index of the shard `wid` of `run_id` (None when `wid` is not one)."""
    prefix = f"{run_id}-s"
    tail = wid[len(prefix) :] if wid.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else None
