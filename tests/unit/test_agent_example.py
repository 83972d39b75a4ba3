"""The shipped agent example (`examples/agent/repo_agent.py`, `agent:repo_agent:solve`) run through the `agent:` env on
the host, with the real `openai` client (installed once per session into a temporary directory, as the sandbox's env
layer would install requirements.txt) and scripted model answers: a command's output reaches the model, the reward
follows the answer, an off-protocol reply is corrected until the budget runs out, every shipped question's answer is
right for the shipped repository, and commands cannot damage the shipped copy or hold the agent."""

from __future__ import annotations

import ast
import configparser
import csv
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trajflow.envs.agent import AgentEnv

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "agent"
REPO = EXAMPLE / "tinyrepo"
QUESTIONS = [q["question"] for q in json.loads((EXAMPLE / "questions.json").read_text())["questions"]]
REQUIREMENT = (EXAMPLE / "requirements.txt").read_text().split()[0]
NO_NETWORK = re.compile(
    r"No matching distribution|Could not find a version|NewConnectionError|Network is unreachable|"
    r"Temporary failure in name resolution|Name or service not known|ConnectTimeout|ProxyError|ConnectionError",
)


@pytest.fixture(scope="session")
def openai_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding `openai` and its requirements (pip from PyPI); skips only when pip cannot reach it."""
    target = tmp_path_factory.mktemp("openai-client")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target", str(target)]
        + [REQUIREMENT],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        if NO_NETWORK.search(done.stdout + done.stderr):
            pytest.skip(f"pip cannot reach PyPI to install {REQUIREMENT}: {done.stderr.strip()[-300:]}")
        pytest.fail(f"pip install {REQUIREMENT} failed:\n{done.stdout}\n{done.stderr}")
    return target


@pytest.fixture()
def make_env(openai_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., AgentEnv]]:
    """AgentEnv("repo_agent:solve", task=...) with the example and `openai` on the child's PYTHONPATH."""
    path = [str(EXAMPLE), str(openai_dir), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
    made: list[AgentEnv] = []

    def make(task: Any = None) -> AgentEnv:
        made.append(AgentEnv("repo_agent:solve", task=task, budget_s=60.0))
        return made[-1]

    yield make
    for env in made:
        env.close()
    assert [t.name for t in threading.enumerate() if t.name.startswith("agent-")] == []


def _last_user(observation: str) -> str:
    messages = json.loads(observation)["messages"]
    assert messages[-1]["role"] == "user"
    return messages[-1]["content"]


def test_a_command_then_the_right_answer_earns_1(make_env: Callable[..., AgentEnv]) -> None:
    env = make_env({"question": 2})
    text, info = env.reset(seed=0)
    first = json.loads(text)
    assert info["call"] == 1 and first["stream"] is False
    assert first["sampling"]["max_tokens"] == 96 and first["sampling"]["temperature"] == 1.0
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert "ANSWER:" in first["messages"][0]["content"] and "```bash" in first["messages"][0]["content"]
    assert "Question: How many lines does data.csv have?" in first["messages"][1]["content"]
    assert "data.csv" in first["messages"][1]["content"].split("\n")[0]  # the file list

    command = "I will count them.\n```bash\nwc -l data.csv\n```"
    text, reward, terminated, _, info = env.step(command)
    second = json.loads(text)
    assert (reward, terminated, info["call"]) == (0.0, False, 2)
    assert second["messages"][:2] == first["messages"]  # the conversation extends: token-faithful turns
    assert second["messages"][2] == {"role": "assistant", "content": command}
    assert second["messages"][3]["content"] == "$ wc -l data.csv\n7 data.csv\n(exit status 0)"

    _, reward, terminated, _, info = env.step("ANSWER: 7")
    assert (reward, terminated, info["exit_status"]) == (1.0, True, 0)
    assert (info["turns"], info["answer"], info["question"]) == (2, "7", 2)


def test_a_wrong_answer_earns_0(make_env: Callable[..., AgentEnv]) -> None:
    env = make_env()
    text, _ = env.reset(seed=4 + 6 * 1000)  # no task: the question is the seed modulo their number
    assert QUESTIONS[4] in _last_user(text)
    _, reward, terminated, _, info = env.step("The most common item.\nANSWER: nuts")
    assert (reward, terminated) == (0.0, True)
    assert (info["turns"], info["answer"], info["question"]) == (1, "nuts", 4)


def test_replies_off_the_protocol_are_corrected_until_the_budget_ends(make_env: Callable[..., AgentEnv]) -> None:
    env = make_env('{"max_tool_turns": 1, "question": 0}')  # as a run config passes it: env kwargs are scalars
    env.reset(seed=0)
    text, reward, terminated, _, _ = env.step("The port is probably 8080.")
    assert (reward, terminated) == (0.0, False)
    correction = _last_user(text)
    assert "```bash" in correction and "ANSWER: <the answer>" in correction and "No commands left" in correction
    _, reward, terminated, _, info = env.step("8421")  # right, but not as an ANSWER line
    assert (reward, terminated) == (0.0, True)
    assert (info["turns"], info["answer"]) == (2, None)


def _answers() -> dict[str, str]:
    """Each shipped question's answer, found in the shipped repository by reading it (and one by its shell command)."""
    config = configparser.ConfigParser()
    config.read(REPO / "config.ini")
    util = ast.parse((REPO / "util.py").read_text())
    returns_list = [
        f.name
        for f in util.body
        if isinstance(f, ast.FunctionDef) and f.returns is not None and ast.unparse(f.returns).startswith("list")
    ]
    assert len(returns_list) == 1
    lines = subprocess.run(["wc", "-l"], stdin=(REPO / "data.csv").open(), capture_output=True, text=True, check=True)
    with (REPO / "data.csv").open() as f:
        rows = list(csv.DictReader(f))
    version = re.findall(r"version (\d+\.\d+\.\d+)", (REPO / "README.md").read_text())
    assert len(version) == 1
    return {
        "Which port does the server listen on, according to config.ini?": config["server"]["port"],
        "Which function in util.py returns a list?": returns_list[0],
        "How many lines does data.csv have?": lines.stdout.strip(),
        "What is the name of the database file in config.ini?": config["database"]["name"],
        "Which item in data.csv has the highest quantity?": max(rows, key=lambda r: int(r["quantity"]))["item"],
        "Which version of tinyrepo does its README give?": version[0],
    }


def test_every_question_has_its_check_here() -> None:
    assert sorted(_answers()) == sorted(QUESTIONS)


@pytest.mark.parametrize("index", range(len(QUESTIONS)), ids=lambda i: f"q{i}")
def test_each_questions_answer_is_right_for_the_shipped_repository(
    make_env: Callable[..., AgentEnv], index: int
) -> None:
    answer = _answers()[QUESTIONS[index]]
    env = make_env(index)
    assert QUESTIONS[index] in _last_user(env.reset(seed=index + 1)[0])  # the task's question wins over the seed
    said = f"ANSWER: `{answer.upper()}`." if index % 2 else f"ANSWER:   {answer}  "  # normalised either way
    _, reward, terminated, _, info = env.step(said)
    assert (reward, terminated, info["question"]) == (1.0, True, index)


def test_commands_run_in_a_copy_and_cannot_hold_the_agent(make_env: Callable[..., AgentEnv]) -> None:
    shipped = sorted(p.name for p in REPO.iterdir())
    env = make_env({"question": 1, "max_tool_turns": 3})
    env.reset(seed=0)
    removed = _last_user(env.step("```bash\nrm -rf ./* && ls -a\n```")[0])
    assert removed == "$ rm -rf ./* && ls -a\n.\n..\n(exit status 0)"
    assert sorted(p.name for p in REPO.iterdir()) == shipped
    flood = _last_user(env.step("```sh\nyes\n```")[0])
    assert flood.startswith("$ yes\ny\ny\n") and flood.endswith(
        "(output cut at 1500 characters)\n(stopped: too much output)"
    )
    start = time.monotonic()
    slow = _last_user(env.step("```bash\nsleep 30 &\nsleep 30\n```")[0])
    assert 5.0 <= time.monotonic() - start < 15.0
    assert slow.startswith("$ sleep 30 &\nsleep 30\n(no output)\n(stopped: timed out after 5 s)\nNo commands left")
    assert env.step("ANSWER: parse_tags")[1] == 1.0
