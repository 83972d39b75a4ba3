"""The `agent:` env (`trajflow/envs/agent.py`) on the host: tiny agent programs, written here and found on the child's
PYTHONPATH, talk HTTP to its endpoint with urllib (as the `openai` client would, minus the client) while the test
drives reset/step; and one agent env through the runner's real Unix socket."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_envs_runner import Client, _wait_for_socket, runner
from trajflow.envs.agent import AgentEnv, AgentError

AGENTS = r"""
import json, os, random, subprocess, sys, time, urllib.error, urllib.request

def post(body, raw=False):
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
    )
    with urllib.request.urlopen(request, timeout=20) as response:
        return (response.headers["Content-Type"], response.read().decode()) if raw else json.load(response)

def user(text):
    return {"role": "user", "content": text}

def two_calls(task, seed):
    with urllib.request.urlopen(os.environ["OPENAI_BASE_URL"] + "/models", timeout=20) as response:
        model = json.load(response)["data"][0]["id"]
    first = post({"model": "x", "messages": [user(f"{task} {seed}")], "temperature": 0.5, "top_p": 0.9,
                  "max_completion_tokens": 7, "stop": "END", "seed": seed})
    said = first["choices"][0]["message"]
    assert first["object"] == "chat.completion" and said["role"] == "assistant" and first["model"] == "x"
    second = post({"messages": [user(f"{task} {seed}"), {"role": "assistant", "content": said["content"]},
                                user("and now?")], "max_tokens": 3})
    done = second["choices"][0]["message"]["content"] == "done" and second["choices"][0]["finish_reason"] == "stop"
    return {"reward": 1.0 if done else 0.0, "info": {"model": model, "first": said["content"]}}

TOOL = {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}

def tool_round_trip(task, seed):
    asked = [user("what is in a.txt?")]
    out = post({"messages": asked, "tools": [TOOL], "tool_choice": "auto"})
    choice = out["choices"][0]
    call = choice["message"]["tool_calls"][0]
    path = json.loads(call["function"]["arguments"])["path"]
    tool_message = {"role": "tool", "tool_call_id": call["id"], "content": f"contents of {path}"}
    final = post({"messages": asked + [choice["message"], tool_message], "tools": [TOOL]})
    ok = choice["finish_reason"] == "tool_calls" and call["function"]["name"] == "read"
    return 1.0 if ok and final["choices"][0]["message"]["content"] == "it says hi" else 0.0

def streaming(task, seed):
    kind, raw = post({"messages": [user("stream")], "stream": True, "stream_options": {"include_usage": True}}, True)
    data = [line[len("data: "):] for line in raw.split("\n") if line.startswith("data: ")]
    chunks = [json.loads(d) for d in data[:-1]]
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    calls = [t for d in deltas for t in d["delta"].get("tool_calls", [])]
    return {"reward": 1.0, "info": {
        "kind": kind, "last": data[-1], "n": len(chunks),
        "objects": sorted({c["object"] for c in chunks}),
        "content": "".join(d["delta"].get("content") or "" for d in deltas),
        "tool": "".join(t["function"].get("name") or "" for t in calls),
        "arguments": "".join(t["function"].get("arguments") or "" for t in calls),
        "finish": [d["finish_reason"] for d in deltas if d["finish_reason"]][0],
        "usage": [c["usage"]["completion_tokens"] for c in chunks if not c["choices"]][0],
    }}

def no_call(task, seed):
    return 0.5

def crash(task, seed):
    raise RuntimeError(f"boom {seed}")

def hang(task, seed):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    open(task["pids"], "w").write(f"{os.getpid()} {child.pid}")
    if task.get("ask_first"):
        post({"messages": [user("one")]})
    time.sleep(60)

def malformed(task, seed):
    if task["case"] == "no messages":
        post({"messages": [user("fine")]})
    body = {"messages": [user("hi")], "n": 2} if task["case"] == "n=2" else {"model": "x", "messages": []}
    try:
        post(body)
    except urllib.error.HTTPError as e:
        open(task["mark"], "w").write(json.dumps({"status": e.code, "body": json.load(e)}))
        raise

def reward_file(task, seed):
    open(os.environ["TRAJFLOW_AGENT_REWARD_FILE"], "w").write('{"reward": 0.25, "info": {"via": "file"}}')

def bad_result(task, seed):
    return "high"

def forge_and_kill(task, seed):  # a tool command writes a winning result where the old runner read it, then kills it
    forged = json.dumps({"value": 1.0})
    script = 'printf %s "$0" > ../result.json; echo 1.0 > "$TRAJFLOW_AGENT_REWARD_FILE"; kill -9 $PPID'
    subprocess.run(["sh", "-c", script, forged])
    time.sleep(30)
    return 0.0

def forge_through_proc(task, seed):  # a tool command writes a winning result into the program's own result pipe
    subprocess.run([sys.executable, "-c", "import json, os; n = json.load(open('../spec.json'))['out']; "
                    "open(f'/proc/{os.getppid()}/fd/{n}', 'w').write(json.dumps({'value': 1.0}))"])
    return 0.0

def seeded(task, seed):
    noise = random.Random(seed).random()
    post({"messages": [user(f"{noise} {','.join({'alpha', 'beta', 'gamma', 'delta', 'epsilon'})}")], "seed": seed})
"""
TIMEOUT_S = 5.0


@pytest.fixture()
def make_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., AgentEnv]]:
    """AgentEnv("agents_under_test:NAME", ...) with AGENTS on the child's PYTHONPATH; at the end every env is closed
    and no endpoint or exit-watcher thread is left."""
    (tmp_path / "agents_under_test.py").write_text(AGENTS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    made: list[AgentEnv] = []

    def make(name: str, **kwargs: Any) -> AgentEnv:
        made.append(AgentEnv(f"agents_under_test:{name}", **kwargs))
        return made[-1]

    yield make
    for env in made:
        env.close()
    assert [t.name for t in threading.enumerate() if t.name.startswith("agent-")] == []


def _gone(pid: int, timeout_s: float = TIMEOUT_S) -> bool:
    """The process has exited (a zombie counts: its parent may be slow to reap it); polled within the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return True
        time.sleep(0.02)
    return False


def _failure(call: Callable[[], object]) -> AgentError:
    with pytest.raises(AgentError) as caught:
        call()
    return caught.value


def test_a_two_call_agent_sees_its_answers_and_returns_its_reward(make_env: Callable[..., AgentEnv]) -> None:
    env = make_env("two_calls", task="add 2 and 2")
    text, info = env.reset(seed=3)
    first = json.loads(text)
    assert first == {
        "messages": [{"role": "user", "content": "add 2 and 2 3"}],
        "tool_choice": None,
        "sampling": {"temperature": 0.5, "top_p": 0.9, "max_tokens": 7, "stop": ["END"], "seed": 3},
        "stream": False,
        "call": 1,
    }
    assert info["call"] == 1 and 0 <= info["agent_seconds"] < TIMEOUT_S
    text, reward, terminated, truncated, info = env.step("four")
    second = json.loads(text)
    assert second["messages"][1] == {"role": "assistant", "content": "four"} and second["call"] == 2
    assert second["sampling"]["max_tokens"] == 3 and (reward, terminated, truncated) == (0.0, False, False)
    text, reward, terminated, truncated, info = env.step(json.dumps({"content": "done"}))
    assert (text, reward, terminated, truncated) == ("", 1.0, True, False)
    assert info["exit_status"] == 0 and info["call"] == 2 and info["first"] == "four"
    assert info["model"] == "trajflow-policy"


def test_a_tool_call_round_trip(make_env: Callable[..., AgentEnv]) -> None:
    env = make_env("tool_round_trip")
    first = json.loads(env.reset(seed=0)[0])
    assert first["tools"][0]["function"]["name"] == "read" and first["tool_choice"] == "auto"
    call = {"id": "call_a", "type": "function", "function": {"name": "read", "arguments": {"path": "a.txt"}}}
    second = json.loads(env.step(json.dumps({"content": None, "tool_calls": [call]}))[0])
    assistant, tool = second["messages"][1:]
    assert assistant["role"] == "assistant" and assistant["content"] is None
    assert assistant["tool_calls"] == [
        {"id": "call_a", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.txt"}'}}
    ]
    assert tool == {"role": "tool", "tool_call_id": "call_a", "content": "contents of a.txt"}
    assert env.step("it says hi")[1:3] == (1.0, True)


def test_a_streamed_answer_reassembles(make_env: Callable[..., AgentEnv]) -> None:
    env = make_env("streaming")
    assert json.loads(env.reset(seed=0)[0])["stream"] is True
    content = "a streamed answer longer than one sixteen-character piece"
    call = {"id": "c1", "function": {"name": "search", "arguments": '{"query": "several pieces of arguments"}'}}
    action = {"content": content, "tool_calls": [call], "usage": {"completion_tokens": 12}}
    _, reward, terminated, _, info = env.step(json.dumps(action))
    assert reward == 1.0 and terminated
    assert info["kind"].startswith("text/event-stream") and info["last"] == "[DONE]"
    assert info["objects"] == ["chat.completion.chunk"] and info["n"] > 6
    assert info["content"] == content and info["tool"] == "search"
    assert info["arguments"] == '{"query": "several pieces of arguments"}'
    assert info["finish"] == "tool_calls" and info["usage"] == 12


def test_a_program_without_requests_ends_at_reset(make_env: Callable[..., AgentEnv]) -> None:
    text, info = make_env("no_call").reset(seed=0)
    assert text == "" and info["terminated"] is True and info["reward"] == 0.5
    assert info["exit_status"] == 0 and info["call"] == 0


def test_a_reward_file_gives_the_reward(make_env: Callable[..., AgentEnv]) -> None:
    _, info = make_env("reward_file").reset(seed=0)
    assert info["terminated"] and info["reward"] == 0.25 and info["via"] == "file"


def test_a_crash_says_crashed_with_its_traceback(make_env: Callable[..., AgentEnv]) -> None:
    error = _failure(lambda: make_env("crash").reset(seed=7))
    assert error.agent_kind == "crashed" and "exited with status 1" in error.message
    assert "Traceback" in error.message and "RuntimeError: boom 7" in error.message
    missing = AgentEnv("no_such_agent_module:run")
    try:
        error = _failure(lambda: missing.reset(seed=0))
    finally:
        missing.close()
    assert error.agent_kind == "crashed" and "No module named 'no_such_agent_module'" in error.message


def test_a_return_value_without_a_reward_is_a_bad_result(make_env: Callable[..., AgentEnv]) -> None:
    error = _failure(lambda: make_env("bad_result").reset(seed=0))
    assert error.agent_kind == "bad_result" and "'high'" in error.message


@pytest.mark.parametrize("ask_first", [False, True])
def test_a_hang_is_killed_within_its_budget(make_env: Callable[..., AgentEnv], tmp_path: Path, ask_first: bool) -> None:
    pids = tmp_path / "pids"
    budget_s = 1.5
    env = make_env("hang", task={"pids": str(pids), "ask_first": ask_first}, budget_s=budget_s)
    start = time.monotonic()
    if ask_first:
        env.reset(seed=0)
        start = time.monotonic()
        error = _failure(lambda: env.step("ok"))
    else:
        error = _failure(lambda: env.reset(seed=0))
    assert error.agent_kind == "hung" and budget_s <= time.monotonic() - start < budget_s + 2.0
    assert ("answer to call 1" if ask_first else "its start") in error.message
    program, child = (int(pid) for pid in pids.read_text().split())
    assert _gone(program) and _gone(child), "the program's process group outlived it"


@pytest.mark.parametrize("case", ["n=2", "no messages"])
def test_a_malformed_request_gets_a_400_and_ends_the_episode(
    make_env: Callable[..., AgentEnv], tmp_path: Path, case: str
) -> None:
    mark = tmp_path / "mark.json"
    env = make_env("malformed", task={"case": case, "mark": str(mark)})
    if case == "n=2":
        error = _failure(lambda: env.reset(seed=0))
    else:
        env.reset(seed=0)
        error = _failure(lambda: env.step("fine"))
    assert error.agent_kind == "malformed_request"
    assert ("n=2" if case == "n=2" else "'messages' must be a non-empty list") in error.message
    got = json.loads(mark.read_text())
    assert got["status"] == 400 and got["body"]["error"]["type"] == "invalid_request_error"
    assert env.pid is None


def test_a_tool_command_that_writes_a_winning_result_and_kills_the_program_scores_nothing(
    make_env: Callable[..., AgentEnv],
) -> None:
    """The result comes through a pipe only the program holds and counts only after its exit status 0: a command
    that writes {"value": 1.0} where the result file once was, a reward file of 1.0, and kills its parent leaves a
    crashed episode (the old runner scored it 1.0)."""
    error = _failure(lambda: make_env("forge_and_kill").reset(seed=0))
    assert error.agent_kind == "crashed" and "killed by signal 9" in error.message, error.message


def test_a_tool_command_cannot_put_a_result_into_the_programs_pipe(make_env: Callable[..., AgentEnv]) -> None:
    """A command that opens the program's result pipe through /proc/PPID/fd (the fd number read from its spec) and
    writes {"value": 1.0}, the program then returning 0.0: never 1.0. In a sandbox, as its unprivileged user, the
    open is refused (the bootstrap is not dumpable) and the program's 0.0 counts; as root (this test's host) it
    succeeds, and two results in the pipe are a bad result."""
    env = make_env("forge_through_proc")
    try:
        observation, info = env.reset(seed=0)
    except AgentError as e:
        assert os.geteuid() == 0 and e.agent_kind == "bad_result" and "something else than one result" in e.message
        return
    assert observation == "" and info["terminated"] and info["reward"] == 0.0, info


def test_the_same_seed_asks_the_same_first_request(make_env: Callable[..., AgentEnv]) -> None:
    env = make_env("seeded")
    first, again, other = env.reset(seed=5)[0], env.reset(seed=5)[0], env.reset(seed=6)[0]
    assert first == again and first != other


def test_a_new_reset_and_close_stop_the_program_and_the_endpoint(make_env: Callable[..., AgentEnv]) -> None:
    env = make_env("two_calls", task="t")
    env.reset(seed=0)
    old = env.pid
    assert old is not None
    env.reset(seed=1)
    assert _gone(old) and env.pid != old
    current, endpoint = env.pid, env._endpoint
    assert current is not None and endpoint is not None
    base = endpoint.base_url
    env.close()
    assert _gone(current) and env.pid is None
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(base + "/models", timeout=TIMEOUT_S)
    with pytest.raises(RuntimeError, match="reset first"):
        env.step("late")


def test_a_bad_action_leaves_the_request_waiting(make_env: Callable[..., AgentEnv]) -> None:
    env = make_env("two_calls", task="t")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="'tool_calls' must be a list"):
        env.step(json.dumps({"content": "x", "tool_calls": "read"}))
    assert json.loads(env.step('{"answer": 4}')[0])["messages"][1]["content"] == '{"answer": 4}'


def test_an_agent_env_through_the_runner(tmp_path: Path) -> None:
    (tmp_path / "agents_under_test.py").write_text(AGENTS)
    path = tmp_path / "env.sock"
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "TRAJFLOW_ENV_HINT": "agent:agents_under_test:two_calls",
    }
    proc = subprocess.Popen([sys.executable, str(runner()), str(path)], env=env)
    try:
        _wait_for_socket(path, proc)
        client = Client(path, timeout_s=TIMEOUT_S * 2)
        out = client(op="reset", env_id="agent:agents_under_test:two_calls", seed=1, env_kwargs={"task": "t"})
        assert out["ok"] and json.loads(out["observation"])["call"] == 1 and out["info"]["call"] == 1
        out = client(op="step", action="four")
        assert out["ok"] and not out["terminated"] and json.loads(out["observation"])["call"] == 2
        out = client(op="step", action="done")
        assert out["ok"] and out["terminated"] and out["reward"] == 1.0 and out["info"]["exit_status"] == 0
        out = client(op="reset", env_id="agent:agents_under_test:crash", seed=2)
        assert out["ok"] is False and set(out["error"]) == {"type", "kind", "message"}
        assert out["error"]["type"] == "AgentError" and out["error"]["kind"] == "crashed"
        assert "RuntimeError: boom 2" in out["error"]["message"]
        task = {"case": "no messages", "mark": str(tmp_path / "mark.json")}
        assert client(op="reset", env_id="agent:agents_under_test:malformed", seed=0, env_kwargs={"task": task})["ok"]
        out = client(op="step", action="fine")
        assert out["ok"] is False and out["error"]["type"] == "AgentError"
        assert out["error"]["kind"] == "malformed_request"
        out = client(op="reset", env_id="agent:agents_under_test:two_calls", seed=0, env_kwargs={"colour": "red"})
        assert out["error"] == {"type": "BadRequest", "message": out["error"]["message"]}
        pids = tmp_path / "pids"
        task = {"pids": str(pids), "ask_first": True}
        assert client(op="reset", env_id="agent:agents_under_test:hang", seed=0, env_kwargs={"task": task})["ok"]
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 128 + signal.SIGTERM, "the runner did not end through its SIGTERM handler"
    program, child = (int(pid) for pid in pids.read_text().split())
    assert _gone(program) and _gone(child), "the agent program outlived its runner"


def test_an_agent_program_dies_with_a_killed_runner(tmp_path: Path) -> None:
    """SIGKILL leaves the runner no teardown: the orphaned program notices within a second and kills its group."""
    (tmp_path / "agents_under_test.py").write_text(AGENTS)
    path, pids = tmp_path / "env.sock", tmp_path / "pids"
    proc = subprocess.Popen(
        [sys.executable, str(runner()), str(path)],
        env={**os.environ, "PYTHONPATH": str(tmp_path), "TMPDIR": str(tmp_path)},
    )
    try:
        _wait_for_socket(path, proc)
        client = Client(path, timeout_s=TIMEOUT_S * 2)
        task = {"pids": str(pids), "ask_first": True}
        assert client(op="reset", env_id="agent:agents_under_test:hang", seed=0, env_kwargs={"task": task})["ok"]
        client.close()
    finally:
        proc.kill()
        proc.wait(timeout=10)
    program, child = (int(pid) for pid in pids.read_text().split())
    assert _gone(program) and _gone(child), "the orphaned agent program outlived its runner"


def test_a_runner_that_reaps_orphans_keeps_no_zombies(tmp_path: Path) -> None:
    """In its container the runner is PID 1: the agent's orphans (its group's guard, a tool's leftovers) become its
    children. A runner made a child subreaper stands in for that: after episodes, none of its children is a zombie."""
    (tmp_path / "agents_under_test.py").write_text(AGENTS)
    path = tmp_path / "env.sock"
    subreaper = (
        "import ctypes, os, sys; ctypes.CDLL(None).prctl(36, 1, 0, 0, 0); os.execv(sys.executable, sys.argv[1:])"
    )
    argv = [sys.executable, "-c", subreaper, sys.executable, str(runner()), str(path)]
    proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(tmp_path), "TMPDIR": str(tmp_path)})
    try:
        _wait_for_socket(path, proc)
        client = Client(path, timeout_s=TIMEOUT_S * 2)
        for seed in range(2):
            out = client(op="reset", env_id="agent:agents_under_test:two_calls", seed=seed, env_kwargs={"task": "t"})
            assert out["ok"] and client(op="step", action="four")["ok"]
            assert client(op="step", action="done")["terminated"]
        task = {"pids": str(tmp_path / "pids"), "ask_first": True}
        assert client(op="reset", env_id="agent:agents_under_test:hang", seed=0, env_kwargs={"task": task})["ok"]
        assert len(_states(proc.pid)) == 1, "the hanging program is the runner's one child"  # the scan sees it
        assert client(op="reset", env_id="agent:agents_under_test:no_call", seed=0)["info"]["reward"] == 0.5
        assert "Z" not in _states(proc.pid), "the runner keeps zombies of agent programs"
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _states(parent: int) -> list[str]:
    """The states (R, S, Z, ...) of `parent`'s child processes."""
    states = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended while listed
        if int(fields[1]) == parent:
            states.append(fields[0])
    return states
