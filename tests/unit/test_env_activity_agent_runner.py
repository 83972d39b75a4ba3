"""The env activities driving a real runner on the host (no Docker: a fake Docker API, as in test_sandbox_client.py)
that hosts `agent:` programs found in a user env directory (`TRAJFLOW_USERENV_DIR`, as the user layer sets it): a
whole episode, a crash with its kind, the budget-sized per-call timeout beating the sandbox's own, and `hung` firing
before it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import docker
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from tests.unit.test_envs_runner import runner as runtime_runner
from tests.unit.test_sandbox_client import FakeApi, FakeClient
from trajflow.activities.env import EnvActivities
from trajflow.contracts import names
from trajflow.contracts.trajectory import EnvResetInput, EnvResetResult, EnvStepInput
from trajflow.sandbox.leases import LeaseBook
from trajflow.sandbox.manager import Sandbox, _ping

PROGRAMS = r"""
import json, os, sys, time, urllib.request

def ask(text):
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", headers={"Content-Type": "application/json"},
        data=json.dumps({"messages": [{"role": "user", "content": text}]}).encode(),
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["choices"][0]["message"]["content"]

def echo(task, seed):
    return 1.0 if ask(f"{task} {seed}") == "yes" else 0.0

def crash(task, seed):
    ask("first")
    print("Boom", file=sys.stderr)
    sys.exit(3)

def slow(task, seed):
    ask("first")
    time.sleep(float(task))
    return 1.0 if ask("second") == "ok" else 0.0
"""
SANDBOX_STEP_TIMEOUT_S = 1.0
"""The sandbox's own timeout, shorter than the slow program's pause: only the per-call timeout lets it through."""


class OneSandbox:
    """The part of SandboxManager the env activities use, around one Sandbox."""

    def __init__(self, box: Sandbox) -> None:
        self.box, self.image, self.leases = box, "runtime:x", LeaseBook()

    def start(self, env_id: str, image: str) -> Sandbox:
        self.leases.add(self.box.id)
        return self.box

    def get(self, sandbox_id: str) -> Sandbox:
        return self.box

    def close(self, sandbox_id: str) -> None:
        self.box.disconnect()


@pytest.fixture()
def acts() -> Iterator[EnvActivities]:
    workdir = Path(tempfile.mkdtemp(prefix="tf-agact-"))
    (workdir / "userenv").mkdir()
    (workdir / "userenv" / "programs.py").write_text(PROGRAMS)
    path = workdir / "env.sock"
    env = {**os.environ, "TRAJFLOW_USERENV_DIR": str(workdir / "userenv")}
    proc = subprocess.Popen([sys.executable, str(runtime_runner()), str(path)], env=env)
    deadline, delay = time.monotonic() + 30, 0.005
    while not (path.exists() and _ping(path, 1.0)):
        assert time.monotonic() < deadline and proc.poll() is None, "runner did not come up"
        time.sleep(delay)  # bounded polling for readiness
        delay = min(delay * 2, 0.1)
    client = cast(docker.DockerClient, FakeClient(FakeApi(proc)))
    box = Sandbox(client, "sb1", "c1", path, SANDBOX_STEP_TIMEOUT_S)
    yield EnvActivities(OneSandbox(box), "default", "w1", SANDBOX_STEP_TIMEOUT_S)  # type: ignore[arg-type]
    box.disconnect()
    proc.kill()
    proc.wait()
    shutil.rmtree(workdir, ignore_errors=True)


async def reset(acts: EnvActivities, function: str, **kwargs: Any) -> EnvResetResult:
    inp = EnvResetInput(trajectory_id="t", env_id=f"agent:programs:{function}", seed=7, env_kwargs=kwargs)
    return await ActivityEnvironment().run(acts.reset, inp)


async def step(acts: EnvActivities, reset: EnvResetResult, action: str) -> Any:
    return await ActivityEnvironment().run(acts.step, EnvStepInput(handle=reset.handle, action=action))


async def test_an_agent_episode_runs_through_the_env_activities(acts: EnvActivities) -> None:
    started = await reset(acts, "echo", task="question")
    request = json.loads(started.observation)
    assert request["call"] == 1 and request["messages"] == [{"role": "user", "content": "question 7"}]
    assert started.handle.env_id == "agent:programs:echo" and started.handle.step_timeout_s == 630.0
    ended = await step(acts, started, "yes")
    assert (ended.observation, ended.reward, ended.terminated) == ("", 1.0, True)


async def test_a_crashing_agent_ends_with_its_kind(acts: EnvActivities) -> None:
    started = await reset(acts, "crash")
    with pytest.raises(ApplicationError) as e:
        await step(acts, started, "fine")
    assert e.value.type == names.ERR_AGENT and e.value.details == ({"agent_kind": "crashed"},)
    assert e.value.message.startswith("agent crashed: the agent program exited with status 3") and "Boom" in str(
        e.value
    )


async def test_an_agent_may_work_longer_than_the_sandbox_step_timeout_within_its_budget(acts: EnvActivities) -> None:
    started = await reset(acts, "slow", task="2", budget_s=5)
    assert started.handle.step_timeout_s == 35.0
    second = await step(acts, started, "go")  # 2 s of work: over the sandbox's 1 s, within the agent's budget
    assert json.loads(second.observation)["call"] == 2
    assert (await step(acts, started, "ok")).reward == 1.0  # the same handle for every step


async def test_a_hung_agent_is_reported_by_the_runner_before_the_sandbox_times_out(acts: EnvActivities) -> None:
    started = await reset(acts, "slow", task="30", budget_s=1)
    began = time.monotonic()
    with pytest.raises(ApplicationError) as e:
        await step(acts, started, "go")
    assert e.value.type == names.ERR_AGENT and e.value.details == ({"agent_kind": "hung"},)
    assert time.monotonic() - began < 10
