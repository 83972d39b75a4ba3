"""The object-store layout (`trajflow.infra.layout`) is a storage format: the keys are pinned here, so a change that
would strand data written by earlier code (runs, replays, the integration tests' reads) fails; and the store the
settings name (`trajflow.infra.store.open_store_from`)."""

from __future__ import annotations

import json
from pathlib import Path

from trajflow.infra import layout
from trajflow.infra.policies import PolicyStore, get_dir, put_dir
from trajflow.infra.settings import Settings
from trajflow.infra.store import LocalStore, S3Store, open_store_from


def test_trajectory_keys_are_stable() -> None:
    assert layout.trajectory_record_key("traj-1", "run-a") == "trajectories/traj-1/run-a/trajectory.json"
    assert layout.context_key("traj-1/run-a", 7) == "trajectories/traj-1/run-a/context-turn007.json"
    assert layout.trajectory_key("traj-1/run-a", "x.json") == "trajectories/traj-1/run-a/x.json"


def test_trajectory_ids_are_made_safe() -> None:
    assert layout.trajectory_key("a b/../c:d/", "t.json") == "trajectories/a_b/_/c_d/t.json"
    assert layout.trajectory_key("/abs", "t.json") == "trajectories/abs/t.json"


def test_run_keys_are_stable() -> None:
    assert layout.step_key("r1", 3) == "runs/r1/steps/v000003.json"
    assert layout.group_manifest_key("r1", 42) == "runs/r1/groups/g000042.json"
    assert layout.group_manifest_key("r1", 1_234_567) == "runs/r1/groups/g1234567.json"
    assert layout.checkpoint_prefix("r1", 3) == "runs/r1/trainer/v000003"
    assert layout.policy_prefix("r1") == "runs/r1/policy"
    assert layout.policy_version_prefix("r1", 12) == "runs/r1/policy/v000012"
    assert layout.policy_latest_key("r1") == "runs/r1/policy/latest.json"
    assert layout.manifest_key(layout.checkpoint_prefix("r1", 3)) == "runs/r1/trainer/v000003/manifest.json"


def test_published_weights_land_where_the_layout_says(tmp_path: Path) -> None:
    """What `trajflow train`'s readers (and tests/integration/test_train_cli.py) look for on disk."""
    store = LocalStore(tmp_path / "store")
    weights = tmp_path / "w"
    weights.mkdir()
    (weights / "model.bin").write_bytes(b"x")
    PolicyStore(store, tmp_path / "cache").publish("r1", 2, weights)
    root = tmp_path / "store"
    assert (root / "runs/r1/policy/latest.json").is_file()
    assert (root / "runs/r1/policy/v000002/model.bin").read_bytes() == b"x"
    assert (root / "runs/r1/policy/v000002/manifest.json").is_file()
    assert PolicyStore(store, tmp_path / "cache2").latest_version("r1") == 2


def test_a_directory_round_trips_through_its_manifest(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    uri = put_dir(store, layout.checkpoint_prefix("r", 1), src)
    assert uri == store.uri_for("runs/r/trainer/v000001/manifest.json")
    out = get_dir(store, layout.checkpoint_prefix("r", 1), tmp_path / "out")
    assert (out / "a.txt").read_text() == "a"


def test_open_store_from_settings(tmp_path: Path) -> None:
    local = open_store_from(Settings(state_dir=tmp_path))
    assert isinstance(local, LocalStore)
    assert local.uri_for("k") == (tmp_path / "store" / "k").resolve().as_uri()
    s3 = open_store_from(Settings(state_dir=tmp_path, store_url="s3://b/p", s3_endpoint_url="http://127.0.0.1:1"))
    assert isinstance(s3, S3Store) and (s3.bucket, s3.prefix) == ("b", "p/")


def test_a_command_on_the_machine_of_an_up_hosts_stack_uses_the_hosts_store(tmp_path: Path) -> None:
    from trajflow.infra import hosts

    settings = Settings(state_dir=tmp_path, hosts_s3_port=9555)
    layout = hosts.Layout("p", "p-net", "img", "172.30.0.1", ["env"], "s3://trajflow/store", "http://172.30.0.1:9555")
    hosts.layout_file(settings).parent.mkdir(parents=True, exist_ok=True)
    hosts.layout_file(settings).write_text(json.dumps(layout.__dict__))
    shared = open_store_from(settings)
    assert isinstance(shared, S3Store) and (shared.bucket, shared.prefix) == ("trajflow", "store/")
    assert shared.endpoint_url == "http://172.30.0.1:9555"
    credentials = shared._client._request_signer._credentials  # the embedded moto store's keys, not the machine's
    assert (credentials.access_key, credentials.secret_key) == ("trajflow", "trajflow")
    own = open_store_from(Settings(state_dir=tmp_path, store_url=str(tmp_path / "mine")))
    assert isinstance(own, LocalStore)  # a store the process names wins
    hosts.layout_file(settings).unlink()
    assert isinstance(open_store_from(settings), LocalStore)
