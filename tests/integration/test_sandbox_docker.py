"""Sandboxes on the real Docker engine: image cache, reset/step, determinism, loss, timeouts, isolation, reaping.

Needs a running Docker engine and root (debootstrap) for the first, cold image build (minutes); later runs
reuse the content-hashed images. The wheel cache is the session cache (tests/conftest.py) + /images.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import docker.errors
import pytest

from trajflow.sandbox import labels
from trajflow.sandbox.errors import EnvError, SandboxLost, SandboxStepTimeout
from trajflow.sandbox.images import base_image_tag, ensure_runtime_image
from trajflow.sandbox.manager import Sandbox, SandboxManager
from trajflow.sandbox.reaper import reap_orphans

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
GUESS = "game:GuessTheNumber-v0-easy"


def wait_until(predicate: Callable[[], bool], timeout_s: float = 30.0, what: str = "condition") -> None:
    """Poll `predicate` with a growing, bounded interval until it holds or the timeout passes."""
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def _container_running(client: docker.DockerClient, container_id: str) -> bool:
    try:
        return bool(client.api.inspect_container(container_id)["State"]["Running"])
    except docker.errors.NotFound:
        return False


@pytest.fixture(scope="module")
def client() -> Iterator[docker.DockerClient]:
    try:
        c = docker.from_env()
        c.ping()
    except docker.errors.DockerException as e:
        pytest.skip(f"no Docker engine: {e}")
    yield c
    c.close()


@pytest.fixture(scope="module")
def image(client: docker.DockerClient, cache_dir: Path) -> str:
    return ensure_runtime_image(client, cache_dir / "images")


@pytest.fixture()
def runtime_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="tf-sb-"))  # short: socket paths are limited to 107 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture()
def make_manager(client: docker.DockerClient, image: str, runtime_dir: Path) -> Iterator[Callable[..., SandboxManager]]:
    managers: list[SandboxManager] = []

    def make(**kwargs: float) -> SandboxManager:
        m = SandboxManager(client, image, runtime_dir, f"test-{uuid.uuid4().hex[:8]}", **kwargs)  # type: ignore[arg-type]
        managers.append(m)
        return m

    yield make
    for m in managers:
        m.close_all()


@pytest.fixture()
def manager(make_manager: Callable[..., SandboxManager]) -> SandboxManager:
    return make_manager()


def test_runtime_image_is_cached(client: docker.DockerClient, cache_dir: Path, image: str) -> None:
    messages: list[str] = []
    started = time.monotonic()
    again = ensure_runtime_image(client, cache_dir / "images", messages.append)
    assert time.monotonic() - started < 5
    assert again == image
    assert not [m for m in messages if "building" in m or "downloading" in m], messages
    assert client.images.get(again).id == client.images.get(image).id
    assert client.images.get(image).labels["trajflow.base"] == base_image_tag()
    history = " ".join(str(layer.get("CreatedBy", "")) for layer in client.api.history(image))
    assert "torch" not in history


def test_reset_and_step(manager: SandboxManager) -> None:
    sandbox = manager.start()
    assert manager.get(sandbox.id) is sandbox
    reset = sandbox.reset(GUESS, 1, {})
    assert "Guess The Number" in reset["observation"]
    assert reset["info"]["suffix"] == "Enter your next guess."
    step = sandbox.step("\\boxed{5}")
    assert step["observation"] == "At turn 1, you guessed 5, and the target number is lower than 5."
    assert (step["reward"], step["terminated"], step["truncated"]) == (0.0, False, False)
    assert sandbox.step("\\boxed{3}")["reward"] == 1.0


def test_env_errors_are_not_infra(manager: SandboxManager) -> None:
    sandbox = manager.start()
    with pytest.raises(EnvError) as caught:
        sandbox.reset("game:NoSuchGame-v0", 1, {})
    assert caught.value.kind == "UnknownEnv"
    assert sandbox.reset(GUESS, 1, {})["observation"]  # the sandbox is still fine


def test_same_seed_same_episode_in_two_sandboxes(manager: SandboxManager) -> None:
    actions = ["\\boxed{5}", "\\boxed{8}", "\\boxed{2}"]

    def episode(sandbox: Sandbox) -> list[str]:
        observations = [sandbox.reset(GUESS, 11, {})["observation"]]
        return observations + [sandbox.step(a)["observation"] for a in actions]

    with ThreadPoolExecutor(2) as pool:  # started and driven concurrently: the manager is thread-safe
        sandboxes = list(pool.map(lambda _: manager.start(), range(2)))
        first, second = pool.map(episode, sandboxes)
    assert sandboxes[0].container_id != sandboxes[1].container_id
    assert first == second


def test_killed_container_is_lost(client: docker.DockerClient, manager: SandboxManager) -> None:
    sandbox = manager.start()
    sandbox.reset(GUESS, 1, {})
    client.api.kill(sandbox.container_id)
    with pytest.raises(SandboxLost) as caught:
        sandbox.step("\\boxed{5}")
    assert not isinstance(caught.value, SandboxStepTimeout)
    with pytest.raises(SandboxLost):
        manager.get(sandbox.id)


def test_step_timeout_kills_the_container(
    client: docker.DockerClient, make_manager: Callable[..., SandboxManager]
) -> None:
    manager = make_manager(step_timeout_s=1.0)
    sandbox = manager.start()
    started = time.monotonic()
    with pytest.raises(SandboxStepTimeout):
        sandbox.request({"op": "sleep", "seconds": 60})  # the runner's test hook: a step that hangs
    assert time.monotonic() - started < 10
    wait_until(lambda: not _container_running(client, sandbox.container_id), 10, "the container to die")
    with pytest.raises(SandboxLost):
        sandbox.step("\\boxed{1}")
    with pytest.raises(SandboxLost):
        manager.get(sandbox.id)


def test_no_network_inside(client: docker.DockerClient, manager: SandboxManager) -> None:
    sandbox = manager.start()
    container = client.containers.get(sandbox.container_id)
    code, out = container.exec_run(["python3", "-c", "import os; print(sorted(os.listdir('/sys/class/net')))"])
    assert code == 0 and isinstance(out, bytes) and out.decode().strip() == "['lo']"
    probe = "import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)"
    code, out = container.exec_run(["python3", "-c", probe])
    assert code != 0 and isinstance(out, bytes) and b"unreachable" in out.lower()


def test_runner_runs_unprivileged(client: docker.DockerClient, manager: SandboxManager) -> None:
    sandbox = manager.start()
    code, out = client.containers.get(sandbox.container_id).exec_run(["python3", "-c", "import os; print(os.getuid())"])
    assert code == 0 and isinstance(out, bytes) and out.decode().strip() == "65534"


def test_close_is_idempotent(client: docker.DockerClient, manager: SandboxManager, runtime_dir: Path) -> None:
    sandbox = manager.start()
    manager.close(sandbox.id)
    manager.close(sandbox.id)
    manager.close("neverexisted")
    with pytest.raises(docker.errors.NotFound):
        client.api.inspect_container(sandbox.container_id)
    assert not (runtime_dir / sandbox.id).exists()
    with pytest.raises(SandboxLost):
        manager.get(sandbox.id)


def test_reaper_removes_only_orphans(client: docker.DockerClient, manager: SandboxManager) -> None:
    # The orphan is one that only this reaper may judge: an earlier run of this very (uniquely named) host, in another
    # pid namespace. A dead-pid orphan would be judged by every reaper on the engine, and an env worker's sweep left
    # running by another test may remove it first (then ours gets 409 and does not count it).
    # The dead-pid rule itself is covered in tests/unit/test_sandbox_labels.py.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_start = labels.process_start_time(dead.pid)
    dead.wait()
    host = f"test-reaper-{uuid.uuid4().hex[:8]}"
    orphan_labels = {
        labels.SANDBOX: "1",
        labels.OWNER: "test-dead-owner",
        labels.OWNER_PID: str(dead.pid),
        labels.OWNER_START: str(dead_start),
        labels.OWNER_PIDNS: "pid:[1]",
        labels.OWNER_HOST: host,
    }
    orphan = client.containers.run(
        base_image_tag(), ["sleep", "300"], detach=True, labels=orphan_labels, network_mode="none"
    )
    live = manager.start()
    try:
        reaped = reap_orphans(client, host_name=host)
        assert orphan.id in reaped
        assert live.container_id not in reaped
        with pytest.raises(docker.errors.NotFound):
            client.api.inspect_container(orphan.id)
        assert _container_running(client, live.container_id)
        assert live.reset(GUESS, 1, {})["observation"]
    finally:
        try:
            orphan.remove(force=True)
        except docker.errors.NotFound:
            pass
