"""Hardened sandboxes, shell tasks, the warm pool and sandbox reuse on the real Docker engine.

Each escape attempt runs as an agent's shell command inside a shell-task sandbox (the way an agent would try it)
and must be contained: the command fails or is killed, the sandbox keeps answering, and the host is unharmed.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from trajflow.sandbox.errors import SandboxLost
from trajflow.sandbox.images import SHELL_TASKS_DIR, ensure_task_image, image_for_env
from trajflow.sandbox.manager import Sandbox, SandboxLimits, SandboxManager
from trajflow.sandbox.pool import WarmPool

pytestmark = pytest.mark.integration

TASK = "slugify"
LIMITS = SandboxLimits(mem_limit="256m", cpus=1.0, pids_limit=64, work_size="32m")


@pytest.fixture(scope="module")
def task_image(docker_client: docker.DockerClient, cache_dir: Path) -> str:
    return ensure_task_image(docker_client, cache_dir / "images", TASK)


@pytest.fixture()
def manager(docker_client: docker.DockerClient, task_image: str) -> Iterator[SandboxManager]:
    runtime_dir = Path(tempfile.mkdtemp(prefix="tf-hd-"))  # short: socket paths are limited to 107 bytes
    m = SandboxManager(docker_client, task_image, runtime_dir, f"test-{uuid.uuid4().hex[:8]}", limits=LIMITS)
    yield m
    m.close_all()
    shutil.rmtree(runtime_dir, ignore_errors=True)


def _shell(manager: SandboxManager, **env_kwargs: object) -> Sandbox:
    box = manager.start(f"shell:{TASK}")
    box.reset(f"shell:{TASK}", 0, {"max_turns": 20, **env_kwargs})
    return box


def _alive(box: Sandbox) -> None:
    assert box.step("echo alive")["observation"] == "alive\n[exit 0]"


def test_task_image_is_the_runtime_plus_the_task(
    docker_client: docker.DockerClient, cache_dir: Path, task_image: str
) -> None:
    assert image_for_env(docker_client, cache_dir / "images", f"shell:{TASK}") == task_image
    runtime = image_for_env(docker_client, cache_dir / "images", "game:GuessTheNumber-v0-easy")
    image = docker_client.images.get(task_image)
    assert image.labels["trajflow.layer"] == "task" and image.labels["trajflow.base"] == runtime
    # the runtime's filesystem layers, then exactly one more: the task files
    runtime_layers = docker_client.images.get(runtime).attrs["RootFS"]["Layers"]
    task_layers = image.attrs["RootFS"]["Layers"]
    assert task_layers[: len(runtime_layers)] == runtime_layers and len(task_layers) == len(runtime_layers) + 1
    out = docker_client.containers.run(task_image, ["ls", f"/opt/trajflow/tasks/{TASK}"], remove=True)
    assert out.decode().split() == ["repo", "task.json"]  # no solution.sh


def test_agent_solves_the_task_inside_the_sandbox(manager: SandboxManager) -> None:
    box = _shell(manager)
    assert box.step("id -u; pwd")["observation"] == "65534\n/work/repo\n[exit 0]"
    solution = (SHELL_TASKS_DIR / TASK / "solution.sh").read_text()
    assert box.step(f"```bash\n{solution}```")["observation"].endswith("[exit 0]")
    final = box.step("submit")
    assert final["terminated"] and final["reward"] == 1.0 and final["info"]["tests_passed"] is True


def test_no_network(manager: SandboxManager) -> None:
    box = _shell(manager)
    probe = "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)\""
    out = box.step(probe)["observation"]
    assert "unreachable" in out.lower() and "[exit 1]" in out
    assert box.step("ls /sys/class/net")["observation"] == "lo\n[exit 0]"


def test_root_is_read_only_and_work_is_writable(manager: SandboxManager) -> None:
    box = _shell(manager)
    for target in ("/etc/evil", "/opt/trajflow/runner.py", "/usr/bin/evil", "/root/evil"):
        out = box.step(f"echo x > {target}")["observation"]
        assert "[exit 1]" in out and ("Read-only" in out or "Permission denied" in out), (target, out)
    assert box.step("echo ok > /work/note && cat /work/note")["observation"] == "ok\n[exit 0]"
    _alive(box)


def test_fork_bomb_is_contained(docker_client: docker.DockerClient, manager: SandboxManager) -> None:
    box = _shell(manager, command_timeout_s=5)
    started = time.monotonic()
    out = box.step("bomb() { bomb | bomb & }; bomb")["observation"]
    assert time.monotonic() - started < 30, out
    stats = docker_client.api.inspect_container(box.container_id)["HostConfig"]
    assert stats["PidsLimit"] == LIMITS.pids_limit
    _alive(box)


def test_memory_hog_is_killed(manager: SandboxManager) -> None:
    box = _shell(manager)
    out = box.step("python3 -c \"x = bytearray(2 * 1024 ** 3); print('allocated')\"")["observation"]
    assert "allocated" not in out and ("MemoryError" in out or "[killed by signal 9]" in out), out
    _alive(box)


def test_sleep_forever_is_killed_at_the_command_timeout(manager: SandboxManager) -> None:
    box = _shell(manager, command_timeout_s=1)
    started = time.monotonic()
    out = box.step("sleep infinity")["observation"]
    assert "timed out after 1s" in out and time.monotonic() - started < 10
    _alive(box)


def test_limits_are_applied(docker_client: docker.DockerClient, manager: SandboxManager) -> None:
    box = _shell(manager)
    host = docker_client.api.inspect_container(box.container_id)["HostConfig"]
    assert host["NanoCpus"] == 10**9 and host["Memory"] == 256 * 2**20 and host["MemorySwap"] == host["Memory"]
    assert host["ReadonlyRootfs"] is True and host["NetworkMode"] == "none" and host["CapDrop"] == ["ALL"]
    burn = "timeout 3 sh -c 'while :; do :; done' & timeout 3 sh -c 'while :; do :; done' & wait"
    box.step(burn)
    stats = docker_client.containers.get(box.container_id).stats(stream=False)
    assert isinstance(stats, dict)  # one snapshot, not a stream
    usage = stats["cpu_stats"]["cpu_usage"]["total_usage"]
    assert usage / 1e9 < 3 * 1.0 + 1.5, usage  # two busy loops for 3 s get about one core's worth, not two


# ---- warm pool ----


def test_warm_pool_hands_out_fresh_started_sandboxes(
    docker_client: docker.DockerClient, manager: SandboxManager
) -> None:
    pool = WarmPool(manager, size=2)
    try:
        hint = f"shell:{TASK}"
        assert pool.wait_full(hint, timeout_s=60)
        seen = set()
        for _ in range(3):
            started = time.monotonic()
            box = pool.take(hint)
            took = time.monotonic() - started
            assert box.container_id not in seen
            seen.add(box.container_id)
            box.reset(hint, 0, {})
            box.step("echo dirty > /work/repo/text.py")
            manager.close(box.id)  # never returned to the pool
            assert pool.wait_full(hint, timeout_s=60)
        assert pool.stats.warm_hits == 3 and pool.stats.cold_starts == 0 and took < 1.0
        again = pool.take(hint)
        again.reset(hint, 0, {})
        assert "dirty" not in again.step("cat text.py")["observation"]  # a fresh repository, not a reused one
    finally:
        pool.close()
    assert pool.idle_count(f"shell:{TASK}") == 0


def test_warm_pool_discards_a_sandbox_that_died_waiting(
    docker_client: docker.DockerClient, manager: SandboxManager
) -> None:
    pool = WarmPool(manager, size=1)
    try:
        assert pool.wait_full("shell:x", timeout_s=60)
        waiting = list(pool._idle.values())[0][0]
        docker_client.api.kill(waiting.container_id)
        box = pool.take("shell:x")
        assert box.container_id != waiting.container_id and pool.stats.discarded_dead == 1
        assert manager.get(box.id) is box
    finally:
        pool.close()


def test_warm_pool_close_removes_waiting_containers(
    docker_client: docker.DockerClient, manager: SandboxManager
) -> None:
    pool = WarmPool(manager, size=2)
    assert pool.wait_full("", timeout_s=60)
    ids = [b.container_id for q in pool._idle.values() for b in q]
    pool.close()
    for cid in ids:
        with pytest.raises(docker.errors.NotFound):
            docker_client.api.inspect_container(cid)


# ---- reuse ----

GAME = "game:GuessTheNumber-v0-easy"


def _play(box: Sandbox, seed: int) -> list[str]:
    """A reset and three guesses: what the env says to each (its target follows from the seed)."""
    said = [box.reset(GAME, seed, {})["observation"]]
    return said + [box.step(f"\\boxed{{{guess}}}")["observation"] for guess in (2, 5, 8)]


def test_a_game_sandbox_serves_up_to_reuse_trajectories_and_plays_as_a_fresh_one(manager: SandboxManager) -> None:
    pool = WarmPool(manager, size=1, reuse=3)
    try:
        fresh = manager.start(GAME)
        expected = {seed: _play(fresh, seed) for seed in (3, 4)}
        manager.close(fresh.id)
        first = pool.take(GAME)
        assert _play(first, 3) == expected[3]
        assert pool.give_back(first.id) and pool.idle_count(GAME) == 1
        assert pool.give_back(first.id) and pool.idle_count(GAME) == 1  # a repeated close: still waiting, once
        second, hit = pool.take_noting_hit(GAME)
        assert hit and second is first  # the same container, not a fresh one
        assert _play(second, 4) == expected[4]  # the env is built anew: the earlier trajectory left nothing
        assert pool.give_back(second.id)
        third = pool.take(GAME)
        assert third is first and third.served == 3
        assert not pool.give_back(third.id)  # used up: closed
        with pytest.raises(SandboxLost):
            manager.get(first.id)
        assert pool.stats.given_back == 2 and pool.stats.closed_on_return == 1
    finally:
        pool.close()


def test_shell_sandboxes_busy_ones_and_disabled_reuse_are_never_given_back(manager: SandboxManager) -> None:
    pool = WarmPool(manager, size=1, reuse=16)
    once = WarmPool(manager, size=1, reuse=1)
    try:
        shell = pool.take(f"shell:{TASK}")
        assert not pool.give_back(shell.id)  # its commands may have changed the container
        busy = pool.take(GAME)
        with manager.leases.in_use(busy.id):
            assert not pool.give_back(busy.id)  # a request still in flight
        single = once.take(GAME)
        assert not once.give_back(single.id)
        assert not {shell.id, busy.id, single.id} & set(manager.sandbox_ids())
    finally:
        pool.close()
        once.close()


def test_returns_after_a_burst_wait_past_the_size_until_trimmed(manager: SandboxManager) -> None:
    pool = WarmPool(manager, size=1, reuse=4)
    try:
        boxes = [pool.take(GAME) for _ in range(3)]  # three trajectories at once: a peak of 3
        assert all(pool.give_back(b.id) for b in boxes)
        assert pool.idle_count(GAME) >= 3  # all kept (the refill may have added its own)
        assert pool.trim(3600) == 0  # none has waited that long
        waiting = pool.idle_count(GAME)
        assert pool.trim(0) == waiting - 1 and pool.idle_count(GAME) == 1  # back to the pool's size
    finally:
        pool.close()
