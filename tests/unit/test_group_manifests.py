"""A sharded run's group manifests in the store: the reward pool's `training.save_group` writes a complete group where
`trajflow.infra.layout.group_manifest_key` says, the same bytes on a retry; the trainer's
`trajflow.activities.batches.step_refs` reads a step's groups back, in group order, and refuses a missing or mismatched
manifest by name. A real local store."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from trajflow.activities.batches import RECORD_READS, load_manifests, step_refs
from trajflow.activities.reward import RewardActivities
from trajflow.contracts import names
from trajflow.contracts.shards import GroupManifest
from trajflow.contracts.steps import TrainRef
from trajflow.contracts.training import TrainerConfig, TrainStepInput
from trajflow.infra import layout
from trajflow.infra.store import LocalStore


def ref(wf: str, group: str, reward: float = 1.0, version: int = 0, task: str = "t") -> TrainRef:
    return TrainRef(
        workflow_id=wf,
        trajectory_uri=f"file:///s/{wf}.json",
        group=group,
        reward=reward,
        policy_version=version,
        task=task,
    )


def manifest(run_id: str, k: int, members: int = 2) -> GroupManifest:
    return GroupManifest(run_id=run_id, k=k, refs=[ref(f"{run_id}-g{k}-m{i}", f"g{k:06d}") for i in range(members)])


@pytest.fixture()
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


async def test_save_group_writes_the_manifest_where_the_layout_says(store: LocalStore) -> None:
    acts = RewardActivities(None, store)  # type: ignore[arg-type]  # saving needs no reward service
    group = manifest("run-a", 42, members=3)
    uri = await ActivityEnvironment().run(acts.save_group, group)
    assert uri == store.uri_for(layout.group_manifest_key("run-a", 42))
    assert (store.root / "runs/run-a/groups/g000042.json").is_file()
    assert GroupManifest.model_validate(store.get_json(uri)) == group
    written = store.get_bytes(uri)
    again = await ActivityEnvironment().run(acts.save_group, group)  # a retry of the same attempt's input
    assert again == uri and store.get_bytes(uri) == written


async def test_save_group_refuses_a_run_id_no_key_can_hold(store: LocalStore) -> None:
    acts = RewardActivities(None, store)  # type: ignore[arg-type]
    with pytest.raises(ApplicationError) as failed:
        await ActivityEnvironment().run(acts.save_group, manifest("../escape", 1))
    assert failed.value.type == names.ERR_BAD_REQUEST and failed.value.non_retryable
    assert store.list() == []


def step(run_id: str, groups: list[tuple[int, int]], refs: list[TrainRef] | None = None) -> TrainStepInput:
    return TrainStepInput(run_id=run_id, version=3, refs=refs or [], trainer=TrainerConfig(), groups=groups)


def put(store: LocalStore, group: GroupManifest, k: int | None = None, run_id: str | None = None) -> None:
    """Write `group` as a shard would, or under another group's (`k`) or run's key."""
    key = layout.group_manifest_key(run_id or group.run_id, group.k if k is None else k)
    store.put_json(key, group)


def test_step_refs_are_the_inputs_then_the_groups_in_ascending_order(store: LocalStore) -> None:
    groups = {k: manifest("run", k, members=1 + k % 3) for k in (0, 3, 4, 7)}
    for group in groups.values():
        put(store, group)
    own = [ref("user-1", "user-g")]
    refs = step_refs(store, step("run", [(7, 8), (3, 5), (0, 1)], own))
    expected = own + groups[0].refs + groups[3].refs + groups[4].refs + groups[7].refs
    assert refs == expected
    assert [m.k for m in load_manifests(store, "run", [(7, 8), (3, 5), (0, 1)])] == [0, 3, 4, 7]


def test_a_step_without_groups_reads_nothing(tmp_path: Path) -> None:
    class NoReads(LocalStore):
        def get_json(self, uri: str) -> dict[str, Any]:
            raise AssertionError(f"read {uri}")

    own = [ref("user-1", "user-g"), ref("user-2", "user-g")]
    assert step_refs(NoReads(tmp_path / "s"), step("run", [], own)) == own


class SlowStore(LocalStore):
    """Counts the reads in flight at once (each takes a few milliseconds, as an S3 GET does)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most = 0

    def get_json(self, uri: str) -> dict[str, Any]:
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        try:
            time.sleep(0.005)
            return super().get_json(uri)
        finally:
            with self.lock:
                self.in_flight -= 1


def test_manifests_are_read_a_bounded_number_at_a_time_in_order(tmp_path: Path) -> None:
    store = SlowStore(tmp_path / "store")
    for k in range(64):
        put(store, manifest("run", k, members=1 + k % 4))
    loaded = load_manifests(store, "run", [(0, 64)], concurrency=RECORD_READS)
    assert [m.k for m in loaded] == list(range(64))
    assert [len(m.refs) for m in loaded] == [1 + k % 4 for k in range(64)]
    assert 1 < store.most <= RECORD_READS


def refused(store: LocalStore, groups: list[tuple[int, int]], run_id: str = "run") -> ApplicationError:
    with pytest.raises(ApplicationError) as failed:
        step_refs(store, step(run_id, groups))
    assert failed.value.type == names.ERR_BAD_REQUEST and failed.value.non_retryable
    return failed.value


def test_a_missing_manifest_is_refused_by_name(store: LocalStore) -> None:
    for k in (0, 1, 3):
        put(store, manifest("run", k))
    error = refused(store, [(0, 4)])
    assert "g000002" in str(error) and "runs/run/groups/g000002.json" in str(error)
    assert "is not in the store" in str(error)


def test_a_mismatched_manifest_is_refused_by_name(store: LocalStore) -> None:
    put(store, manifest("run", 5), k=6)  # group 5's samples under group 6's key
    error = refused(store, [(6, 7)])
    assert "g000006" in str(error) and "runs/run/groups/g000006.json" in str(error) and "group 5" in str(error)
    put(store, manifest("other-run", 1), run_id="run")  # another run's group 1 under this run's key
    error = refused(store, [(1, 2)])
    assert "runs/run/groups/g000001.json" in str(error) and "'other-run'" in str(error)


def test_a_garbled_manifest_is_refused_by_name(store: LocalStore) -> None:
    store.put_bytes(layout.group_manifest_key("run", 2), b"{not json")
    assert "runs/run/groups/g000002.json" in str(refused(store, [(2, 3)]))
    store.put_json(layout.group_manifest_key("run", 3), {"run_id": "run", "k": 3, "refs": []})  # no samples
    error = refused(store, [(3, 4)])
    assert "g000003" in str(error) and "is not a group manifest" in str(error)


@pytest.mark.parametrize("groups", [[(0, 2), (1, 3)], [(2, 2)], [(3, 1)], [(-1, 1)], [(0, 1), (0, 1)]])
def test_bad_group_ranges_are_refused(store: LocalStore, groups: list[tuple[int, int]]) -> None:
    for k in range(4):
        put(store, manifest("run", k))
    assert "group ranges" in str(refused(store, groups))
