"""An `agent:MODULE:FUNCTION` program the way a run submits it: its directory packed into the store, its user layer
built from the package, then run by the env activities in a hardened sandbox (no network: the endpoint is on the
sandbox's loopback), its module imported from the layer. A whole episode and a crash with its kind; the trajectory
workflow's side is not wired here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from trajflow.activities.env import EnvActivities
from trajflow.contracts import names
from trajflow.contracts.agent import STEP_MARGIN_S
from trajflow.contracts.envs import EnvStepResult
from trajflow.contracts.trajectory import EnvResetInput, EnvResetResult, EnvStepInput
from trajflow.sandbox.user.submit import package_env
from trajflow.sandbox.user_images import USER_REPO

pytestmark = pytest.mark.integration

PROGRAM = r"""
import json, os, sys, urllib.request

from helpers import question

def ask(text):
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", headers={"Content-Type": "application/json"},
        data=json.dumps({"messages": [{"role": "user", "content": text}]}).encode(),
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["choices"][0]["message"]["content"]

def solve(task, seed):
    first = ask(question(task, seed))
    return {"reward": 1.0 if ask(f"you said {first}") == "done" else 0.0, "info": {"first": first}}

def forge(task, seed):  # a tool command tries to write a winning result into the program's result pipe
    ask("first")
    script = ("import json, os; n = json.load(open('../spec.json'))['out']; "
              "open(f'/proc/{os.getppid()}/fd/{n}', 'w').write(json.dumps({'value': 1.0}))")
    import subprocess
    tried = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    return {"reward": 0.0, "info": {"forge_status": tried.returncode, "forge_stderr": tried.stderr[-300:]}}

def knock(task, seed):  # a tool command tries to drive the runner itself through its socket
    ask("first")
    script = ("import json, os, socket; s = socket.socket(socket.AF_UNIX); s.settimeout(20); "
              "s.connect(os.environ.get('TRAJFLOW_ENV_SOCKET', '/run/trajflow/env.sock')); "
              "s.sendall(json.dumps({'op': 'step', 'action': 'done'}).encode() + b'\\n'); "
              "print(s.makefile().readline())")
    import subprocess
    tried = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    return {"reward": 0.0, "info": {"knock_status": tried.returncode, "knock_said": tried.stdout + tried.stderr[-300:]}}

async def crash(task, seed):
    ask("first")
    print("the agent fell over", file=sys.stderr)
    raise SystemExit(2)
"""


@pytest.fixture()
def agent_package(store, cache_dir, tmp_path: Path) -> str:
    root = tmp_path / "agent"
    root.mkdir()
    (root / "bot.py").write_text(PROGRAM)
    (root / "helpers.py").write_text("def question(task, seed):\n    return f'{task} (seed {seed})'\n")
    return package_env("agent:bot:solve", str(root), store, cache_dir / "images", print)


async def reset(acts: EnvActivities, function: str, package: str) -> EnvResetResult:
    inp = EnvResetInput(
        trajectory_id="t", env_id=f"agent:bot:{function}", seed=5, env_kwargs={"task": "2+2?"}, env_package=package
    )
    return await ActivityEnvironment().run(acts.reset, inp)


async def test_an_agent_program_runs_from_its_layer_in_a_sandbox(
    sandbox_manager, package_images, agent_package, docker_client
) -> None:
    acts = EnvActivities(sandbox_manager, "default", "w1", 30, images=package_images)
    started = await reset(acts, "solve", agent_package)
    try:
        assert started.handle.image.startswith(f"{USER_REPO}:") and started.handle.env_id == "agent:bot:solve"
        assert started.handle.step_timeout_s == 600 + STEP_MARGIN_S
        request = json.loads(started.observation)
        assert request["call"] == 1 and request["messages"] == [{"role": "user", "content": "2+2? (seed 5)"}]
        second = await ActivityEnvironment().run(acts.step, EnvStepInput(handle=started.handle, action="4"))
        assert json.loads(second.observation)["messages"][0]["content"] == "you said 4"
        end = await ActivityEnvironment().run(acts.step, EnvStepInput(handle=started.handle, action="done"))
        assert (end.observation, end.reward, end.terminated, end.info["first"]) == ("", 1.0, True, "4")
    finally:
        sandbox_manager.close(started.handle.sandbox_id)
    assert docker_client.images.get(started.handle.image).labels["trajflow.layer"] == "userenv"


async def test_a_crashing_agent_program_in_a_sandbox_ends_with_its_kind(
    sandbox_manager, package_images, agent_package
) -> None:
    acts = EnvActivities(sandbox_manager, "default", "w1", 30, images=package_images)
    started = await reset(acts, "crash", agent_package)
    try:
        with pytest.raises(ApplicationError) as e:
            await ActivityEnvironment().run(acts.step, EnvStepInput(handle=started.handle, action="go on"))
    finally:
        sandbox_manager.close(started.handle.sandbox_id)
    assert e.value.type == names.ERR_AGENT and e.value.details == ({"agent_kind": "crashed"},)
    assert e.value.message.startswith("agent crashed: the agent program exited with status 2")
    assert "the agent fell over" in e.value.message


async def _answer_once(sandbox_manager, package_images, agent_package: str, function: str) -> EnvStepResult:
    """Start `function`, answer its first request, and return the step that ends it."""
    acts = EnvActivities(sandbox_manager, "default", "w1", 30, images=package_images)
    started = await reset(acts, function, agent_package)
    try:
        return await ActivityEnvironment().run(acts.step, EnvStepInput(handle=started.handle, action="go on"))
    finally:
        sandbox_manager.close(started.handle.sandbox_id)


async def test_a_tool_command_in_a_sandbox_cannot_write_the_programs_result(
    sandbox_manager, package_images, agent_package
) -> None:
    """As the sandbox's unprivileged user, a command the program runs cannot open the program's result pipe through
    /proc/PPID/fd (the bootstrap is not dumpable): its open fails and the program's own 0.0 is the reward."""
    end = await _answer_once(sandbox_manager, package_images, agent_package, "forge")
    assert (end.reward, end.terminated) == (0.0, True), end
    assert end.info["forge_status"] == 1 and "PermissionError" in str(end.info["forge_stderr"]), end.info


async def test_a_tool_command_in_a_sandbox_cannot_drive_the_runner(
    sandbox_manager, package_images, agent_package
) -> None:
    """The runner is the sandbox's PID 1 and serves only its host side (outside the sandbox's pid namespace): a
    command the program runs connects to the runner's socket, sends a step, and is refused with one error line; the
    episode goes on and ends with the program's own reward."""
    end = await _answer_once(sandbox_manager, package_images, agent_package, "knock")
    assert (end.reward, end.terminated) == (0.0, True), end
    said = str(end.info["knock_said"])
    assert end.info["knock_status"] == 0 and "refused: process" in said and "only its host side" in said, end.info
