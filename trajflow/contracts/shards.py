"""The fan-in tree of a sharded training run (`[train] groups_per_shard`, docs/capacity.md): the groups a shard
workflow runs, the one message a group sends up when it ends, the manifest of a group's samples in the store, the
compact sets of group indices the training workflow holds, and a step's batch figures the trainer returns.

A sharded run's training workflow starts `ShardWorkflow`s of up to `groups_per_shard` groups each; a shard starts
its groups' trajectories (they report to it), applies the group rules (redundant samples, replacements,
abandoning), writes a complete group's `GroupManifest` to the store and signals one `GroupReport` upward. So the
training workflow holds ranges of group indices and counters, never a trajectory's entry.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from typing import Annotated

from pydantic import BeforeValidator, ConfigDict, Field, PlainSerializer

from trajflow.contracts.limits import WorkflowIdRef
from trajflow.contracts.steps import TaskStats, TrainRef, lag_histogram
from trajflow.contracts.trainer import NanSafeContract

_Model = NanSafeContract


def flat_ranges(ranges: Sequence[tuple[int, int]]) -> list[int]:
    """Sorted, disjoint ranges `[start, end)` as one flat list of (gap, length) pairs, each gap from the previous
    range's end (the first from 0): small numbers whatever the indices, about 4 bytes a range in JSON where a pair of
    six-digit indices takes 16."""
    out: list[int] = []
    end = 0
    for start, stop in ranges:
        out += [start - end, stop - start]
        end = stop
    return out


def _read_ranges(value: object) -> object:
    """The flat form back to ranges; a list of pairs (the model's own form, or a hand-written input) as it is."""
    if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
        return value
    if len(value) % 2:
        raise ValueError(f"flat ranges need (gap, length) pairs, got {len(value)} numbers")
    ranges, end = [], 0
    for gap, length in zip(value[::2], value[1::2], strict=True):
        if gap < 0 or length < 1:
            raise ValueError(f"flat ranges need gaps >= 0 and lengths >= 1, got ({gap}, {length})")
        ranges.append((end + gap, end + gap + length))
        end += gap + length
    return ranges


Ranges = Annotated[list[tuple[int, int]], BeforeValidator(_read_ranges), PlainSerializer(flat_ranges, when_used="json")]
"""Sorted, disjoint ranges of group indices, written in JSON (the payloads Temporal carries) as `flat_ranges`."""


class IndexSet(_Model):
    """A set of group indices as sorted, disjoint, half-open ranges `[start, end)`: admission numbers groups in order
    and they mostly end in order, so a run's thousands of groups take a few ranges (at worst one range per index)."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    ranges: Ranges = Field(default_factory=list)

    @classmethod
    def of(cls, indices: Iterable[int]) -> IndexSet:
        out = cls()
        for k in sorted(set(indices)):
            out.add(k)
        return out

    def __len__(self) -> int:
        return sum(end - start for start, end in self.ranges)

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def __iter__(self) -> Iterator[int]:
        for start, end in self.ranges:
            yield from range(start, end)

    def __contains__(self, k: object) -> bool:
        if not isinstance(k, int):
            return False
        i = bisect_right(self.ranges, (k, float("inf"))) - 1
        return i >= 0 and self.ranges[i][0] <= k < self.ranges[i][1]

    def add(self, k: int) -> None:
        """Add `k` (no-op when present), merging with the ranges it touches."""
        if k in self:
            return
        i = bisect_right(self.ranges, (k, float("inf")))  # ranges[:i] start at or before k
        left = i > 0 and self.ranges[i - 1][1] == k
        right = i < len(self.ranges) and self.ranges[i][0] == k + 1
        if left and right:
            self.ranges[i - 1 : i + 1] = [(self.ranges[i - 1][0], self.ranges[i][1])]
        elif left:
            self.ranges[i - 1] = (self.ranges[i - 1][0], k + 1)
        elif right:
            self.ranges[i] = (k, self.ranges[i][1])
        else:
            self.ranges.insert(i, (k, k + 1))

    def add_range(self, start: int, end: int) -> None:
        for k in range(start, end):
            self.add(k)

    def remove(self, k: int) -> bool:
        """Remove `k`; False when it was not there."""
        i = bisect_right(self.ranges, (k, float("inf"))) - 1
        if i < 0 or not self.ranges[i][0] <= k < self.ranges[i][1]:
            return False
        start, end = self.ranges[i]
        pieces = [(a, b) for a, b in ((start, k), (k + 1, end)) if a < b]
        self.ranges[i : i + 1] = pieces
        return True

    def lowest(self, m: int) -> list[int]:
        """The `m` lowest indices (fewer when the set is smaller)."""
        out: list[int] = []
        for start, end in self.ranges:
            out.extend(range(start, min(end, start + m - len(out))))
            if len(out) >= m:
                break
        return out


class GroupSpec(_Model):
    """One group a shard runs: its index (`g{k:06d}`), env seed and task (an index into the run's tasks)."""

    k: Annotated[int, Field(ge=0)]
    seed: int
    task: Annotated[int, Field(ge=0)]


class GroupCounts(_Model):
    """What one group's members added to the run's counters (`TrainingCounters` of the same names)."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    started: int = 0
    completed: int = 0
    failed: int = 0
    infra_failed: int = 0
    cancelled: int = 0
    late: int = 0
    duplicates: int = 0


class GroupReport(_Model):
    """The one message a shard sends up for a group, when the group ends (the `group_finished` signal)."""

    shard: WorkflowIdRef
    k: Annotated[int, Field(ge=0)]
    ready: bool
    """n samples completed and their manifest is in the store; False: abandoned (members failed past the group's
    restart budget)."""
    oldest_version: int = 0
    """The lowest policy version of the group's samples (what staleness counts), when ready."""
    manifest_uri: str | None = None
    flat: bool = False
    """The group's rewards are all equal (`trajflow.contracts.steps.is_flat`); set only with `filter_flat_groups`,
    the training workflow then drops it within `max_flat_groups_per_step`."""
    counts: GroupCounts = Field(default_factory=GroupCounts)
    last_error: str | None = None
    """The last infra failure of a member, if any (named when admission pauses)."""


class ShardDone(_Model):
    """A shard's last message (the `shard_finished` signal): every group of it reported and every member closed;
    `counts` is what its members added since its last `GroupReport` (late reports of cancelled redundant samples)."""

    shard: WorkflowIdRef
    first: Annotated[int, Field(ge=0)]
    counts: GroupCounts = Field(default_factory=GroupCounts)


class GroupManifest(_Model):
    """A complete group's samples, in member order: the store object `trajflow.infra.layout.group_manifest_key`
    names."""

    run_id: str
    k: int
    refs: list[TrainRef] = Field(min_length=1)


class BatchStats(_Model):
    """A step's batch figures, computed by the trainer from the samples it read (a sharded run's training workflow
    never sees them one by one)."""

    trajectories: int
    reward_mean: float
    wins: int = 0
    staleness: dict[int, int] = Field(default_factory=dict)
    """Lag (the step's version - the sample's) -> samples."""
    by_task: dict[str, TaskStats] = Field(default_factory=dict)

    @classmethod
    def of(cls, refs: Sequence[TrainRef], version: int) -> BatchStats:
        """The figures of a step that trains on `refs` from policy version `version` (the trainer's before the step),
        counted as a direct run's step record counts its batch (`trajflow.workflows.bookkeeping.Book.finish_step`)."""
        return cls(
            trajectories=len(refs),
            reward_mean=sum(r.reward for r in refs) / len(refs) if refs else 0.0,
            wins=sum(r.won for r in refs),
            staleness=lag_histogram(version - r.policy_version for r in refs),
            by_task=TaskStats.of(list(refs)),
        )


class ShardedState(_Model):
    """The training workflow's part of a sharded run's state: sizes independent of trajectories (group ranges)."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    open: IndexSet = Field(default_factory=IndexSet)
    """Groups admitted whose report has not arrived."""
    ready: dict[int, IndexSet] = Field(default_factory=dict)
    """Oldest policy version -> complete groups waiting to be trained on (their manifests are in the store)."""
    shards: IndexSet = Field(default_factory=IndexSet)
    """The first group index of each shard not known to have closed (its id: `shard_id(run, first)`)."""
    shard_sizes: dict[int, int] = Field(default_factory=dict)
    """First group index -> groups in that shard, for the shards in `shards`."""
    last_error: str | None = None


def shard_id(run_id: str, first: int) -> str:
    """The workflow id of the shard whose first group is `first`."""
    return f"{run_id}-s{first:06d}"


def group_name(k: int) -> str:
    """The group key of index `k` (`g{k:06d}`, as a direct run names its groups)."""
    return f"g{k:06d}"
