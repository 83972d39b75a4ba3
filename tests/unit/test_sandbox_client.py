"""`Sandbox` request handling against a real runner on the host, with a fake Docker API (no Docker)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import docker
import pytest

from tests.unit.test_envs_runner import runner as runtime_runner
from trajflow.sandbox.errors import EnvError, SandboxLost, SandboxStepTimeout
from trajflow.sandbox.manager import Sandbox, _ping


@dataclass
class FakeApi:
    """Stands in for `docker.APIClient`: `kill` ends the runner process, like killing its container."""

    proc: subprocess.Popen[bytes]
    killed: list[str] = field(default_factory=list)

    def kill(self, container_id: str) -> None:
        self.killed.append(container_id)
        self.proc.kill()
        self.proc.wait()

    def inspect_container(self, container_id: str) -> dict[str, Any]:
        running = self.proc.poll() is None
        return {"State": {"Running": running, "Status": "running" if running else "exited", "ExitCode": 0}}


@dataclass
class FakeClient:
    api: FakeApi


@pytest.fixture()
def runner() -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    workdir = Path(tempfile.mkdtemp(prefix="tf-sbc-"))
    path = workdir / "env.sock"
    proc = subprocess.Popen([sys.executable, str(runtime_runner()), str(path)])
    deadline = time.monotonic() + 30
    delay = 0.005
    while not (path.exists() and _ping(path, 1.0)):
        assert time.monotonic() < deadline and proc.poll() is None, "runner did not come up"
        time.sleep(delay)  # bounded polling for readiness
        delay = min(delay * 2, 0.1)
    yield proc, path
    proc.kill()
    proc.wait()
    shutil.rmtree(workdir, ignore_errors=True)


def _sandbox(runner: tuple[subprocess.Popen[bytes], Path], step_timeout_s: float = 60) -> tuple[Sandbox, FakeApi]:
    proc, path = runner
    api = FakeApi(proc)
    client = cast(docker.DockerClient, FakeClient(api))  # a fake of the one part Sandbox uses: client.api
    return Sandbox(client, "sb1", "c1", path, step_timeout_s), api


def test_reset_and_step(runner: tuple[subprocess.Popen[bytes], Path]) -> None:
    sandbox, _ = _sandbox(runner)
    reset = sandbox.reset("game:GuessTheNumber-v0-easy", 1, {})
    assert "Guess The Number" in reset["observation"]
    step = sandbox.step("\\boxed{5}")
    assert step["observation"] == "At turn 1, you guessed 5, and the target number is lower than 5."
    assert step["reward"] == 0.0 and step["terminated"] is False and step["truncated"] is False


def test_env_error_is_not_infra(runner: tuple[subprocess.Popen[bytes], Path]) -> None:
    sandbox, _ = _sandbox(runner)
    with pytest.raises(EnvError) as caught:
        sandbox.reset("game:NoSuchGame-v0", 1)
    assert caught.value.kind == "UnknownEnv"
    assert not isinstance(caught.value, SandboxLost)
    assert sandbox.lost_reason is None
    sandbox.reset("game:GuessTheNumber-v0-easy", 1)  # still usable


def test_timeout_kills_and_loses(runner: tuple[subprocess.Popen[bytes], Path]) -> None:
    sandbox, api = _sandbox(runner, step_timeout_s=0.3)
    with pytest.raises(SandboxStepTimeout):
        sandbox.request({"op": "sleep", "seconds": 30})
    assert api.killed == ["c1"]
    with pytest.raises(SandboxLost):
        sandbox.step("\\boxed{1}")


def test_dead_runner_is_lost(runner: tuple[subprocess.Popen[bytes], Path]) -> None:
    sandbox, api = _sandbox(runner)
    sandbox.reset("game:GuessTheNumber-v0-easy", 1)
    api.proc.kill()
    api.proc.wait()
    with pytest.raises(SandboxLost) as caught:
        sandbox.step("\\boxed{5}")
    assert not isinstance(caught.value, SandboxStepTimeout)
    assert "exited" in str(caught.value)
