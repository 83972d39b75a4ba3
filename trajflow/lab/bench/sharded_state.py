"""How many bytes a *sharded* training run's state takes at steady state (`[train] groups_per_shard` N > 0,
docs/capacity.md): the continue-as-new input, the `progress` query's result and the `state` query's result, as
`trajflow.lab.bench.state_size` measures a direct run's.

The state is built by the sharded run's own rules (`trajflow.workflows.fanin.ShardBook`: next_shard, shard_started,
group_report, shard_done, drop_stale, take_batch, finish_step), driven as the training workflow and its shards drive
them: admission starts every shard the budget allows at once, shards report their groups, a shard whose groups all
reported sends `ShardDone`. HISTORY_KEPT steps are trained first (groups reported in index order, each at its
admission's version; each trainer result carries the 21 metrics of `state_size.trainer_result` and the step's
`BatchStats`: the staleness of the groups taken, two tasks' stats). Then, from that history, the pipeline is filled
and reported in one of two layouts:

- "typical": groups report in index order, but one in 8 (k % 8 == 7, a straggler) reports after every other open
  group; a group's oldest policy version is the one its shard was admitted at. The sets of group indices hold about
  one range per straggler.
- "worst": every other group of each shard reports first (the even indices, then the odd ones), and the oldest
  versions of consecutive reports differ (i % (α + 1) versions past admission), so each index the sets hold is a
  range of its own: the most fragments admission allows (every group in flight one range, with a step in flight).

Without a step in flight, groups report until one short of a batch (B/n - 1 ready: one more and the step starts).
With a step in flight, they report until a batch is ready, the step takes it (the lowest ready indices), then half of
the open groups left report. Byte counts are those of pydantic's JSON and do not depend on the machine.

    python -m trajflow.lab.bench.state_size --batch 65536 --group 16 --alpha 2 --groups-per-shard 64
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable

from trajflow.contracts.shards import BatchStats, GroupCounts, GroupReport, ShardDone, shard_id
from trajflow.contracts.steps import TaskStats
from trajflow.contracts.training import TrainingRunConfig, TrainingState, TrainStepInput
from trajflow.lab.bench import state_size
from trajflow.lab.bench.state_size import StateSize, trainer_result
from trajflow.workflows.bookkeeping import HISTORY_KEPT
from trajflow.workflows.fanin import ShardBook

LAYOUTS = ("typical", "worst")
"""The orders groups report in (the module docstring)."""
STRAGGLER_EVERY = 8
"""In the typical layout, one group in this many reports late."""


def _typical(open_groups: Iterable[int]) -> list[int]:
    ks = list(open_groups)
    return [k for k in ks if k % STRAGGLER_EVERY != STRAGGLER_EVERY - 1] + [
        k for k in ks if k % STRAGGLER_EVERY == STRAGGLER_EVERY - 1
    ]


def _worst(open_groups: Iterable[int]) -> list[int]:
    # shards are full and start at multiples of their size (even): even k is every other group of each shard
    ks = list(open_groups)
    return [k for k in ks if k % 2 == 0] + [k for k in ks if k % 2]


ORDERS: dict[str, Callable[[Iterable[int]], list[int]]] = {"typical": _typical, "worst": _worst}
"""Layout -> the order the open groups report in."""


class Driver:
    """Drives a `ShardBook` as the training workflow and its shards do: what each shard knows about its groups (the
    version it was admitted at, their task) is kept here, outside the state, as the shards keep it."""

    def __init__(self, cfg: TrainingRunConfig, state: TrainingState) -> None:
        self.cfg = cfg
        self.rules = ShardBook(cfg, state)
        self.s = state
        self.admitted_at: dict[int, int] = {}
        """Open group -> the policy version its shard was admitted at (its samples' oldest)."""
        self.task: dict[int, int] = {}
        """Group admitted and not yet trained on -> its task."""
        self.version: dict[int, int] = {}
        """Ready group -> the oldest version it reported."""

    def fork(self, state: TrainingState) -> Driver:
        """A driver of `state` (a copy of this one's), knowing what this one knows."""
        other = Driver(self.cfg, state)
        other.admitted_at, other.task, other.version = dict(self.admitted_at), dict(self.task), dict(self.version)
        return other

    def admit(self) -> None:
        """Start every shard the admission budget allows (the admission loop)."""
        while (start := self.rules.next_shard()) is not None:
            self.rules.shard_started()
            for spec in start.groups:
                self.admitted_at[spec.k] = start.min_policy_version
                self.task[spec.k] = spec.task

    def report(self, k: int, lag: int = 0) -> None:
        """Group `k` is complete: its shard reports it (n samples, the oldest `lag` versions after its admission
        but no newer than the trainer's)."""
        n, r = self.cfg.group_size, self.cfg.redundancy
        version = min(self.s.version, self.admitted_at.pop(k) + lag)
        first = k - k % self.cfg.shard_size()
        counts = GroupCounts(started=n + r, completed=n, cancelled=r)
        outcome = self.rules.group_report(
            GroupReport(shard=shard_id(self.s.run_id, first), k=k, ready=True, oldest_version=version, counts=counts)
        )
        assert outcome.counted, f"group {k} was open"
        self.version[k] = version

    def report_all(self, order: list[int], skew: bool = False) -> None:
        """The groups of `order` report, in that order, their shards closing once all theirs did. With `skew`, the
        oldest version of the i-th is i % (α + 1) versions past its admission (so the ready sets, one per version,
        interleave); without, its admission's version."""
        for i, k in enumerate(order):
            self.report(k, lag=i % (self.cfg.alpha + 1) if skew else 0)
        self.close_done_shards()

    def close_done_shards(self) -> None:
        """Each shard whose groups all reported sends its last message."""
        sh = self.rules.sh
        for first in list(sh.shards):
            size = sh.shard_sizes.get(first, 0)
            if not any(k in sh.open for k in range(first, first + size)):
                self.rules.shard_done(ShardDone(shard=shard_id(self.s.run_id, first), first=first))

    def take_batch(self) -> TrainStepInput:
        """The workflow's wait for a batch: stale groups dropped, then the step."""
        self.rules.drop_stale()
        step = self.rules.take_batch()
        assert step is not None, "a full batch of groups was reported"
        return step

    def train(self, step: TrainStepInput) -> None:
        """The trainer's result for `step` (its metrics, the batch figures of the groups taken), then admission."""
        n, tasks = self.cfg.group_size, [t.name for t in self.cfg.tasks]
        lags: dict[int, int] = {}
        per_task: dict[str, list[float]] = {}
        for start, end in step.groups:
            for k in range(start, end):
                lag = step.version - self.version.pop(k)
                lags[lag] = lags.get(lag, 0) + n
                crc = zlib.crc32(f"{self.s.run_id}/{k}".encode())
                per_task.setdefault(tasks[self.task.pop(k)], []).append(crc / 2**32)  # a group's mean reward
        by_task = {
            name: TaskStats(trajectories=n * len(means), reward_mean=round(sum(means) / len(means), 6), wins=n // 2)
            for name, means in per_task.items()
        }
        rewards = [m for means in per_task.values() for m in means]
        batch = BatchStats(
            trajectories=n * len(rewards),
            reward_mean=sum(rewards) / len(rewards),
            wins=sum(t.wins * len(per_task[name]) for name, t in by_task.items()),
            staleness=dict(sorted(lags.items())),
            by_task=by_task,
        )
        result = trainer_result(step).model_copy(update={"batch": batch})
        self.rules.finish_step(step, result, time_s=12.5 * (self.s.version + 1))
        self.admit()


def history(cfg: TrainingRunConfig, run_id: str = "grpo-countdown-0412") -> tuple[TrainingState, Driver]:
    """A sharded run of `cfg` after HISTORY_KEPT steps, its groups reported in index order; the driver that holds
    what its shards know."""
    assert cfg.shard_groups() > 0, "a sharded config"
    s = TrainingState(run_id=run_id, started_at=0.0)
    run = Driver(cfg, s)
    per_step = cfg.batch_size // cfg.group_size
    run.admit()
    for _ in range(HISTORY_KEPT):
        run.report_all(run.rules.sh.open.lowest(per_step - run.rules.ready_count()))
        run.train(run.take_batch())
    return s, run


def steady_state(
    cfg: TrainingRunConfig, past: tuple[TrainingState, Driver], layout: str, training: bool
) -> TrainingState:
    """`past` (a `history`) with its pipeline full in `layout`, a step in flight if `training` (the module
    docstring)."""
    s = past[0].model_copy(deep=True)
    run = past[1].fork(s)
    order, per_step, skew = ORDERS[layout], cfg.batch_size // cfg.group_size, layout == "worst"
    run.admit()
    if training:
        run.report_all(order(run.rules.sh.open)[: per_step - run.rules.ready_count()], skew)
        run.take_batch()
        run.admit()
        run.report_all(order(run.rules.sh.open)[: len(run.rules.sh.open) // 2], skew)
    else:
        run.report_all(order(run.rules.sh.open)[: per_step - 1 - run.rules.ready_count()], skew)
    assert s.history and len(s.history) == HISTORY_KEPT
    return s


def ranges(s: TrainingState) -> int:
    """The ranges of group indices the state holds (open, ready, the step's groups, the live shards)."""
    sh = s.sharded
    if sh is None:
        return 0
    held = len(sh.open.ranges) + sum(len(v.ranges) for v in sh.ready.values()) + len(sh.shards.ranges)
    return held + (len(s.step.groups) if s.step is not None else 0)


def sizes(cfg: TrainingRunConfig, layouts: tuple[str, ...] = LAYOUTS) -> list[StateSize]:
    """The bytes of `cfg`'s sharded steady states, per layout, without and with a step in flight."""
    past = history(cfg)
    return [
        measure(cfg, steady_state(cfg, past, layout, training), layout, training)
        for layout in layouts
        for training in (False, True)
    ]


def measure(cfg: TrainingRunConfig, s: TrainingState, layout: str, training: bool) -> StateSize:
    sh = s.sharded
    assert sh is not None
    return state_size.measure(
        cfg,
        s,
        training,
        open_groups=len(sh.open) + sum(len(v) for v in sh.ready.values()),
        groups_per_shard=cfg.shard_groups(),
        layout=layout,
        ranges=ranges(s),
        shards=len(sh.shards),
    )
