"""An agent program's verifier (`env_kwargs["verifier"]`, `trajflow/envs/agent_verify.py`) on the host: programs and
verifiers in a stand-in user layer (TRAJFLOW_USERENV_DIR), an `agent:` or `agent-cmd:` env driven by reset/step; the
verifier reads what the program left in its work directory, and its return value is the episode's reward."""

from __future__ import annotations

import json
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_agent_env import _failure, _gone
from trajflow.envs.agent import AgentEnv, AgentError
from trajflow.envs.agent_cmd import CommandAgentEnv

PROGRAMS = r"""
import json, os, urllib.request

def ask(text):
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"messages": [{"role": "user", "content": text}]}).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
    )
    with urllib.request.urlopen(request, timeout=20) as response:
        return json.load(response)["choices"][0]["message"]["content"]

def edit(task, seed):
    os.makedirs("repo")
    open("repo/answer.txt", "w").write(ask(f"{task} {seed}"))

def own_reward(task, seed):
    open("answer.txt", "w").write("mine")
    return {"reward": 0.1, "info": {"own": True}}

def crash(task, seed):
    open("answer.txt", "w").write("half")
    raise RuntimeError("the program gave up")

def unserializable(task, seed):
    return object()
"""
CHECKS = r"""
import json, os, subprocess, sys, time

def check_file(task, seed, result):
    found = open("repo/answer.txt").read() if os.path.exists("repo/answer.txt") else None
    seen = {"endpoint": "OPENAI_BASE_URL" in os.environ, "stdin": sys.stdin is None or sys.stdin.read() == ""}
    return {"reward": 1.0 if found == "fixed" else 0.0, "info": {"result": result, "found": found, "task": task,
            "seed": seed, "env_seed": os.environ["TRAJFLOW_AGENT_SEED"], **seen}}

def override(task, seed, result):
    return {"reward": 0.9 if open("answer.txt").read() == "mine" else 0.0, "info": {"result": result}}

def boom(task, seed, result):
    raise ValueError("the verifier found nothing to check")

def nothing(task, seed, result):
    return None

def hang(task, seed, result):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    open(task["pids"], "w").write(f"{os.getpid()} {child.pid}")
    time.sleep(60)

def marks(task, seed, result):
    open(task["mark"], "w").write("ran")
    return 1.0

async def asynchronous(task, seed, result):
    return len(os.listdir("."))
"""
COMMANDS = {
    "edit.sh": "#!/bin/sh\nmkdir repo && echo fixed > repo/answer.txt\n",
    "scored.sh": "#!/bin/sh\nmkdir repo && printf fixed > repo/answer.txt\n"
    + 'echo \'{"reward": 0.2}\' > "$TRAJFLOW_AGENT_REWARD_FILE"\n',
    "fail.sh": '#!/bin/sh\necho "no luck" >&2\nexit 3\n',
}


@pytest.fixture()
def layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A stand-in user layer with PROGRAMS, CHECKS and COMMANDS; at the end no endpoint or watcher thread is left."""
    root = tmp_path / "layer"
    root.mkdir()
    (root / "programs.py").write_text(PROGRAMS)
    (root / "checks.py").write_text(CHECKS)
    for name, text in COMMANDS.items():
        (root / name).write_text(text)
        (root / name).chmod(0o755)
    monkeypatch.setenv("TRAJFLOW_USERENV_DIR", str(root))
    yield root
    assert [t.name for t in threading.enumerate() if t.name.startswith("agent-")] == []


@pytest.fixture()
def make_env(layer: Path) -> Iterator[Callable[..., AgentEnv]]:
    """`agent:programs:NAME` (or, for a NAME with a dot, `agent-cmd:NAME`) with `verifier="checks:CHECK"`."""
    made: list[AgentEnv] = []

    def make(name: str, check: str, **kwargs: Any) -> AgentEnv:
        verifier = f"checks:{check}"
        env = (
            CommandAgentEnv(name, verifier=verifier, **kwargs)
            if "." in name
            else AgentEnv(f"programs:{name}", verifier=verifier, **kwargs)
        )
        made.append(env)
        return env

    yield make
    for env in made:
        env.close()


def test_a_verifier_reads_the_file_the_program_left_in_its_work_directory(make_env: Callable[..., AgentEnv]) -> None:
    env = make_env("edit", "check_file", task={"fix": "it"})
    text, info = env.reset(seed=4)
    assert json.loads(text)["messages"][0]["content"] == "{'fix': 'it'} 4" and info["call"] == 1
    text, reward, terminated, _, info = env.step("fixed")
    assert (text, reward, terminated) == ("", 1.0, True)
    assert info["found"] == "fixed" and info["task"] == {"fix": "it"} and (info["seed"], info["env_seed"]) == (4, "4")
    assert info["result"] == {"value": None, "exit_status": 0, "reward_file": None}
    assert info["verifier"] == "checks:check_file" and info["exit_status"] == 0 and info["call"] == 1
    assert info["endpoint"] is False and info["stdin"] is True


def test_the_verifier_overrides_the_programs_own_reward(make_env: Callable[..., AgentEnv]) -> None:
    _, info = make_env("own_reward", "override").reset(seed=1)  # no request: the episode ends at reset
    assert info["terminated"] is True and info["reward"] == 0.9 and "own" not in info
    assert info["result"] == {"value": {"reward": 0.1, "info": {"own": True}}, "exit_status": 0, "reward_file": None}


def test_an_async_verifier_is_awaited_in_the_work_directory(make_env: Callable[..., AgentEnv]) -> None:
    _, info = make_env("own_reward", "asynchronous").reset(seed=1)
    assert info["reward"] == 1.0 and info["verifier"] == "checks:asynchronous"  # answer.txt alone in the work dir


def test_a_raising_verifier_is_a_bad_result_naming_it_with_its_stderr(make_env: Callable[..., AgentEnv]) -> None:
    error = _failure(lambda: make_env("own_reward", "boom").reset(seed=1))
    assert error.agent_kind == "bad_result" and "the verifier checks:boom exited with status 1" in error.message
    assert "ValueError: the verifier found nothing to check" in error.message


def test_a_verifier_without_a_reward_is_a_bad_result(make_env: Callable[..., AgentEnv]) -> None:
    error = _failure(lambda: make_env("own_reward", "nothing").reset(seed=1))
    assert error.agent_kind == "bad_result" and "the verifier checks:nothing gives no reward" in error.message


def test_a_hanging_verifier_is_killed_with_its_group_at_the_budget(
    make_env: Callable[..., AgentEnv], tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    error = _failure(lambda: make_env("own_reward", "hang", task={"pids": str(pids)}, budget_s=1.5).reset(seed=1))
    assert error.agent_kind == "bad_result" and "the verifier checks:hang did not finish within budget_s=1.5" in (
        error.message
    )
    verifier, child = map(int, pids.read_text().split())
    assert _gone(verifier) and _gone(child), "the verifier's process group outlived its budget"


def test_a_crashed_program_stays_crashed_and_its_verifier_does_not_run(
    make_env: Callable[..., AgentEnv], tmp_path: Path
) -> None:
    mark = tmp_path / "mark"
    error = _failure(lambda: make_env("crash", "marks", task={"mark": str(mark)}).reset(seed=1))
    assert error.agent_kind == "crashed" and "RuntimeError: the program gave up" in error.message
    assert not mark.exists()
    error = _failure(lambda: make_env("fail.sh", "marks", task={"mark": str(mark)}).reset(seed=1))
    assert error.agent_kind == "crashed" and "exited with status 3" in error.message and not mark.exists()


def test_a_return_value_that_is_not_json_stays_a_bad_result(make_env: Callable[..., AgentEnv], tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    error = _failure(lambda: make_env("unserializable", "marks", task={"mark": str(mark)}).reset(seed=1))
    assert error.agent_kind == "bad_result" and "not JSON" in error.message and not mark.exists()


def test_an_agent_cmd_program_with_a_verifier(make_env: Callable[..., AgentEnv]) -> None:
    _, info = make_env("edit.sh", "check_file").reset(seed=2)  # status 0 without a reward file: the verifier decides
    assert info["reward"] == 0.0 and info["found"] == "fixed\n"
    assert info["result"] == {"value": None, "exit_status": 0, "reward_file": None}
    _, info = make_env("scored.sh", "check_file").reset(seed=2)
    assert info["reward"] == 1.0 and info["result"]["reward_file"] == {"reward": 0.2}


def test_the_work_directory_is_removed_after_the_verifier(
    make_env: Callable[..., AgentEnv], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    _, info = make_env("own_reward", "override").reset(seed=1)
    assert info["reward"] == 0.9 and list(scratch.iterdir()) == []
    with pytest.raises(AgentError):
        make_env("own_reward", "boom").reset(seed=1)
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize("verifier", ["checks", "checks:", "a b:c", 3])
def test_a_bad_verifier_name_is_refused(layer: Path, verifier: object) -> None:
    with pytest.raises(ValueError, match="verifier must be a string MODULE:FUNCTION"):
        AgentEnv("programs:edit", verifier=verifier)  # type: ignore[arg-type]
