"""A sharded run's group manifests in the store: the reward pool's `training.save_group` writes a complete group where
`infra.layout.group_manifest_key` says, the same bytes on a retry; the trainer's `activities.batches.step_refs` reads
a step's groups back, in group order, and refuses a missing or mismatched manifest by name. A real local store."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.reward import RewardActivities
from infra import layout
from infra.store import LocalStore
from trajflow.contracts import names
from trajflow.contracts.shards import GroupManifest
from trajflow.contracts.steps import TrainRef


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
