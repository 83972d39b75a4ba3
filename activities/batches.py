"""What a train step reads from the store: its samples' refs and their trajectory records, a bounded number at a time
(one at a time, a step of thousands spent most of its time waiting on the store). Shared by the trainer activity and
the benchmarks' simulated trainer (`trajflow.lab.bench.sim_trainer`), so both train on the same list.

A step's refs (`step_refs`) are those its input carries, then those of a sharded run's groups: each group index in
`TrainStepInput.groups`, in ascending order, names a `GroupManifest` the shard wrote
(`trajflow.infra.layout.group_manifest_key`). A missing, unreadable or mismatched manifest fails the step without retry
(`ERR_BAD_REQUEST`, naming the group and its key): the shard writes it before it reports the group, so its absence is
lost data, not a delay. Any other store error (an unreachable S3) propagates and is retried.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from pydantic import ValidationError
from temporalio.exceptions import ApplicationError

from trajflow.contracts import names
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.shards import GroupManifest, group_name
from trajflow.contracts.steps import TrainRef
from trajflow.contracts.training import TrainStepInput
from trajflow.infra.layout import group_manifest_key
from trajflow.infra.store import ObjectNotFound, ObjectStore

RECORD_READS = 8
"""Objects a step reads from the store at once (below boto3's default pool of 10 connections)."""
T = TypeVar("T")
R = TypeVar("R")


def read_all(read: Callable[[T], R], items: list[T], concurrency: int = RECORD_READS) -> list[R]:
    """`read` of each item, in the order of `items`, `concurrency` at a time; the first failed read raises."""
    if len(items) <= 1 or concurrency <= 1:
        return [read(item) for item in items]
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="store-reads") as pool:
        return list(pool.map(read, items))


def load_records(store: ObjectStore, uris: list[str], concurrency: int = RECORD_READS) -> list[TrajectoryRecord]:
    """The records at `uris`, in that order, read `concurrency` at a time; the first failed read raises."""
    return read_all(lambda u: TrajectoryRecord.model_validate(store.get_json(u)), uris, concurrency)


def group_indices(groups: list[tuple[int, int]]) -> list[int]:
    """The group indices of ranges `[start, end)`, ascending; empty, overlapping or inverted ranges are a bad
    request (a step names each group once, `IndexSet.ranges`)."""
    indices = [k for start, end in groups for k in range(start, end)]
    bad = [(start, end) for start, end in groups if start < 0 or end <= start]
    if bad or len(set(indices)) != len(indices):
        raise ApplicationError(
            f"a step's group ranges must be disjoint, non-empty [start, end) with 0 <= start, got {groups}",
            type=names.ERR_BAD_REQUEST,
            non_retryable=True,
        )
    return sorted(indices)


def load_manifest(store: ObjectStore, run_id: str, k: int) -> GroupManifest:
    """Group `k`'s manifest of run `run_id`, checked to be that group's; a non-retryable bad request otherwise."""
    key = group_manifest_key(run_id, k)
    try:
        manifest = GroupManifest.model_validate(store.get_json(store.uri_for(key)))
    except ObjectNotFound:
        problem = "is not in the store"
    except ValidationError as e:  # a ValueError too: caught first
        problem = f"is not a group manifest: {e}"
    except ValueError as e:  # not JSON, not a JSON object, or a key the run id breaks
        problem = f"cannot be read: {e}"
    else:
        if (manifest.run_id, manifest.k) == (run_id, k):
            return manifest
        problem = f"belongs to run {manifest.run_id!r}, group {manifest.k}"
    raise ApplicationError(
        f"run {run_id!r}: the manifest of group {group_name(k)} ({key}) {problem}",
        type=names.ERR_BAD_REQUEST,
        non_retryable=True,
    )


def load_manifests(
    store: ObjectStore, run_id: str, groups: list[tuple[int, int]], concurrency: int = RECORD_READS
) -> list[GroupManifest]:
    """The manifests of the groups in ranges `groups`, in ascending group order, read `concurrency` at a time."""
    return read_all(lambda k: load_manifest(store, run_id, k), group_indices(groups), concurrency)


def step_refs(store: ObjectStore, inp: TrainStepInput, concurrency: int = RECORD_READS) -> list[TrainRef]:
    """What step `inp` trains on: `inp.refs`, then the refs of its groups' manifests in group order (member order
    within a group). Reads the store only when the step has groups."""
    manifests = load_manifests(store, inp.run_id, inp.groups, concurrency) if inp.groups else []
    return [*inp.refs, *(r for m in manifests for r in m.refs)]
