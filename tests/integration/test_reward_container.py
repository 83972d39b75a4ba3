"""The reward service as a container, run the way an HTTP container platform runs it: the image's own CMD,
bound to `0.0.0.0` inside the container, told its port through `$PORT`, reached through a published port.

Builds (or finds cached) `trajflow-reward:<hash>` on the session's image cache; the first, cold build fetches
wheels and takes about a minute (plus the base layer's debootstrap if even that is missing). Each test's
container is removed whatever happens. Not covered: a real serverless platform (scale to zero, TLS, auth).
"""

from __future__ import annotations

import importlib.metadata
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import docker.models.containers
import httpx
import pytest

from tests.conftest import free_port
from trajflow.contracts.scoring import ScoreRequest
from trajflow.rewards.client import RewardClient, RewardRequestRejected, RewardVerifierTimedOut
from trajflow.sandbox.builder.reward_image import REWARD_REQUIREMENTS, SERVICE_UID, ensure_reward_image

pytestmark = pytest.mark.integration

GUESS = "game:GuessTheNumber-v0-easy"


@dataclass
class Service:
    container: docker.models.containers.Container
    url: str


@pytest.fixture(scope="module")
def reward_image(docker_client: docker.DockerClient, cache_dir: Path) -> str:
    started = time.monotonic()
    tag = ensure_reward_image(docker_client, cache_dir / "images", progress=print)
    size_mb = docker_client.images.get(tag).attrs["Size"] / 1e6
    print(f"\nreward image {tag}: ready in {time.monotonic() - started:.2f}s, {size_mb:.0f} MB")
    return tag


def _wait_healthy(container: docker.models.containers.Container, url: str, timeout_s: float = 30.0) -> None:
    """Poll /healthz with a growing, bounded interval; fail early, with its logs, if the container exits."""
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while True:
        container.reload()
        if container.status not in ("created", "running"):
            logs = container.logs().decode(errors="replace")[-2000:]
            code = container.attrs["State"]["ExitCode"]
            pytest.fail(f"reward container is {container.status} (exit {code}):\n{logs}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).json() == {"ok": True}:
                return
        except (httpx.TransportError, ValueError):
            pass  # not listening yet (the port is published before the service binds it)
        if time.monotonic() > deadline:
            logs = container.logs().decode(errors="replace")[-2000:]
            pytest.fail(f"reward container at {url} not healthy within {timeout_s}s:\n{logs}")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


@pytest.fixture(scope="module")
def service(docker_client: docker.DockerClient, reward_image: str) -> Iterator[Service]:
    # Only PORT is set, as a platform does; HOST stays the image's 0.0.0.0. The container port is published on
    # loopback only, so nothing outside this machine can reach it.
    container_port, host_port = free_port(), free_port()
    container = docker_client.containers.run(
        reward_image,
        detach=True,
        name=f"trajflow-reward-test-{uuid.uuid4().hex[:8]}",
        environment={"PORT": str(container_port)},
        ports={f"{container_port}/tcp": ("127.0.0.1", host_port)},
        labels={"trajflow.test": "reward-container"},
    )
    try:
        url = f"http://127.0.0.1:{host_port}"
        _wait_healthy(container, url)
        yield Service(container=container, url=url)
    finally:
        container.remove(force=True)


def test_requirements_pin_the_project_environment() -> None:
    for requirement in REWARD_REQUIREMENTS:
        name, _, version = requirement.partition("==")
        assert importlib.metadata.version(name) == version, f"{requirement} differs from the installed {name}"


def test_image_is_configured_for_container_platforms(docker_client: docker.DockerClient, reward_image: str) -> None:
    config = docker_client.images.get(reward_image).attrs["Config"]
    assert config["Cmd"] == ["python3", "-m", "trajflow.rewards.service"]
    assert {"HOST=0.0.0.0", "PORT=8080"} <= set(config["Env"])
    assert config["User"] == f"{SERVICE_UID}:{SERVICE_UID}"
    assert "8080/tcp" in config["ExposedPorts"]


def test_cached_call_does_not_build(docker_client: docker.DockerClient, cache_dir: Path, reward_image: str) -> None:
    messages: list[str] = []
    started = time.monotonic()
    assert ensure_reward_image(docker_client, cache_dir / "images", progress=messages.append) == reward_image
    assert time.monotonic() - started < 5
    assert messages == [f"reward image {reward_image} is cached"]


async def test_scores_with_env_outcome(service: Service) -> None:
    async with RewardClient(service.url, timeout_s=10) as client:
        assert "env_outcome" in await client.reward_fns()
        result = await client.score(ScoreRequest(env_id=GUESS, env_rewards=[0.0, 1.0]))
    assert result.reward == 1.0
    assert result.reward_fn == "env_outcome"


async def test_scores_a_dataset_answer_with_math_verify(service: Service) -> None:
    """The verifier rewards work in the container (Math-Verify installed, run in the service's verifier worker
    processes, started by a forkserver as the unprivileged user): 1/2 is 0.5, and 1/3 is not."""
    half = ["\\boxed{\\frac{1}{2}}"]
    request = ScoreRequest(env_id="data:x", reward_fn="math_verify", actions=half, final_info={"answer": "0.5"})
    async with RewardClient(service.url, timeout_s=30) as client:
        right = await client.score(request)
        wrong = await client.score(request.model_copy(update={"actions": ["\\boxed{1/3}"]}))
    assert (right.reward, right.details["correct"], wrong.reward) == (1.0, True, 0.0)


async def test_a_pathological_answer_times_out_in_the_container(service: Service) -> None:
    """Debian's Python in the image kills an overrunning verifier's worker too (the default 5 s limit), and goes on."""
    request = ScoreRequest(
        env_id="data:x", reward_fn="math_verify", actions=["\\boxed{9**9**9**9}"], final_info={"answer": "0.5"}
    )
    async with RewardClient(service.url, timeout_s=30) as client:
        with pytest.raises(RewardVerifierTimedOut, match="verifier 'math_verify' timed out after 5 s"):
            await client.score(request)
        right = await client.score(request.model_copy(update={"actions": ["\\boxed{1/2}"]}))
    assert right.reward == 1.0


async def test_unknown_reward_fn_is_rejected(service: Service) -> None:
    async with RewardClient(service.url, timeout_s=10) as client:
        with pytest.raises(RewardRequestRejected) as info:
            await client.score(ScoreRequest(env_id=GUESS, env_rewards=[1.0], reward_fn="no-such-fn"))
    assert info.value.status_code == 404
    assert "env_outcome" in info.value.service_message


def test_service_runs_as_non_root(service: Service) -> None:
    status = service.container.exec_run(["cat", "/proc/1/status"], user="0")  # root only to read, not to run
    assert status.exit_code == 0, status.output
    assert isinstance(status.output, bytes)  # not streamed
    uids = next(line.split()[1:] for line in status.output.decode().splitlines() if line.startswith("Uid:"))
    assert uids == [str(SERVICE_UID)] * 4  # real, effective, saved and filesystem uid of the service (PID 1)
