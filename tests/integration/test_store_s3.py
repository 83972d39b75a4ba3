"""S3Store against a real S3-protocol server (`moto_server` on loopback), with dummy credentials."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from trajflow.contracts.scoring import ScoreResult
from trajflow.infra.store import ObjectNotFound, ObjectStore, S3Store, open_store

pytestmark = pytest.mark.integration

_DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _moto_server() -> str:
    path = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
    if path is None:
        pytest.fail("moto_server not found: install the dev extra (moto[server])")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto S3 server on a free loopback port, with dummy credentials in this process's environment."""
    port = _free_port()
    env = {**os.environ, **_DUMMY_AWS_ENV}
    cmd = [_moto_server(), "-H", "127.0.0.1", "-p", str(port)]
    log_path = tmp_path_factory.mktemp("moto") / "moto_server.log"  # a file, not a pipe: it never fills up
    log = log_path.open("wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as mp:
        for name, value in _DUMMY_AWS_ENV.items():
            mp.setenv(name, value)
        for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_ENDPOINT_URL"):
            mp.delenv(name, raising=False)
        try:
            end = time.monotonic() + 30.0
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"moto_server exited with {proc.returncode}:\n{log_path.read_text()[-2000:]}")
                try:
                    httpx.get(url, timeout=1.0)  # any HTTP answer means it is serving
                    break
                except httpx.TransportError:
                    if time.monotonic() > end:
                        pytest.fail(f"moto_server at {url} not ready within 30 s")
                    time.sleep(0.05)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            log.close()


@pytest.fixture
def store(endpoint: str) -> S3Store:
    """A fresh bucket per test, so tests never see each other's objects."""
    return S3Store(f"test-{uuid.uuid4().hex[:12]}", endpoint_url=endpoint, create_bucket=True)


def test_bytes_round_trip(store: S3Store) -> None:
    uri = store.put_bytes("runs/r1/tokens.bin", bytes(range(256)))
    assert uri == f"s3://{store.bucket}/runs/r1/tokens.bin" == store.uri_for("runs/r1/tokens.bin")
    assert store.get_bytes(uri) == bytes(range(256))
    assert store.put_bytes("runs/r1/tokens.bin", b"v2") == uri
    assert store.get_bytes(uri) == b"v2"
    assert isinstance(store, ObjectStore)


def test_json_round_trip(store: S3Store) -> None:
    uri = store.put_json("a.json", {"x": [1, 2.5], "y": "z"})
    assert store.get_json(uri) == {"x": [1, 2.5], "y": "z"}
    model = ScoreResult(reward=-0.5, reward_fn="env_final", details={"turns": 2, "terminated": True})
    assert ScoreResult.model_validate(store.get_json(store.put_json("m.json", model))) == model


def test_list_and_exists(store: S3Store) -> None:
    keys = ["runs/r1/a", "runs/r1/b/c", "runs/r10/a", "top"]
    uris = [store.put_bytes(k, b"x") for k in keys]
    assert store.list("runs/r1/") == uris[:2]
    assert store.list("runs/r1") == uris[:3]
    assert store.list() == sorted(uris)
    assert store.list("none/") == []
    assert store.exists(uris[0])
    assert not store.exists(store.uri_for("runs/r1/zzz"))


def test_put_file(store: S3Store, tmp_path) -> None:
    src = tmp_path / "w.bin"
    src.write_bytes(b"x" * 100)
    assert store.get_bytes(store.put_file("runs/r/w.bin", src)) == b"x" * 100


def test_delete_is_idempotent(store: S3Store) -> None:
    uri = store.put_bytes("runs/r1/gone.bin", b"x")
    store.delete(uri)
    assert not store.exists(uri)
    store.delete(uri)


def test_missing_object_is_object_not_found(store: S3Store) -> None:
    uri = store.uri_for("never/written")
    with pytest.raises(ObjectNotFound) as info:
        store.get_bytes(uri)
    assert info.value.uri == uri
    with pytest.raises(KeyError):
        store.get_json(uri)


def test_foreign_uris_and_bad_keys_are_value_errors(store: S3Store) -> None:
    for uri in ["s3://another-bucket/k", "file:///tmp/k", "k"]:
        with pytest.raises(ValueError):
            store.get_bytes(uri)
    with pytest.raises(ValueError, match="object key"):
        store.put_bytes("../escape", b"x")


def test_one_client_shared_by_threads(store: S3Store) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        uris = list(pool.map(lambda i: store.put_bytes(f"par/{i:03d}", str(i).encode()), range(40)))
        values = list(pool.map(store.get_bytes, uris))
    assert values == [str(i).encode() for i in range(40)]
    assert store.list("par/") == uris


def test_open_store_with_a_prefix(endpoint: str) -> None:
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    store = open_store(f"s3://{bucket}/exp/one", s3_endpoint_url=endpoint, create_bucket=True)
    assert isinstance(store, S3Store) and store.prefix == "exp/one/"
    uri = store.put_json("traj/1.json", {"reward": 1.0})
    assert uri == f"s3://{bucket}/exp/one/traj/1.json"
    sibling = open_store(f"s3://{bucket}/exp/two", s3_endpoint_url=endpoint, create_bucket=True)  # idempotent
    sibling.put_bytes("traj/1.json", b"{}")
    assert store.list("traj/") == [uri]  # a prefix scopes listing...
    assert sibling.get_json(uri) == {"reward": 1.0}  # ...but any URI in the same bucket reads


async def test_a_trajectory_stores_its_data_in_s3(
    endpoint: str, temporal_env, reward_service, sandbox_manager, tiny_model
) -> None:
    """The same workers with the S3 backend: context and trajectory records land in the bucket."""
    from tests.conftest import running_stack
    from trajflow.contracts.records import TrajectoryRecord
    from trajflow.contracts.trajectory import TrajectoryStatus
    from trajflow.rl.engines.hf import HFEngine

    store = open_store(f"s3://traj-{uuid.uuid4().hex[:8]}/runs", s3_endpoint_url=endpoint, create_bucket=True)
    engine = HFEngine(tiny_model, max_batch=4, batch_wait_ms=5)
    await engine.start()
    try:
        async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as stack:
            result = await stack.run(stack.request(seed=21, max_turns=2))
    finally:
        await engine.close()
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert result.trajectory_uri is not None and result.trajectory_uri.startswith("s3://")
    record = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri))
    assert record.context is not None and len(record.context.token_ids) > 0
    assert any(uri.endswith("context-turn000.json") for uri in store.list("trajectories/"))


def test_a_step_reads_its_records_concurrently_in_order(store: S3Store) -> None:
    """The trainer's `load_records` over the S3 protocol: every record, in the order asked, several reads at once;
    a missing record fails the read as ObjectNotFound."""
    from tests.unit.test_rl_samples import record
    from trajflow.activities.batches import load_records

    uris = [store.put_json(f"records/{i:04d}.json", record(f"wf-{i}", float(i))) for i in range(64)]
    loaded = load_records(store, uris, concurrency=8)
    assert [r.workflow_id for r in loaded] == [f"wf-{i}" for i in range(64)]
    assert [r.reward for r in loaded] == [float(i) for i in range(64)]
    with pytest.raises(ObjectNotFound):
        load_records(store, [*uris[:5], store.uri_for("records/missing.json"), *uris[5:10]])
