"""The `agent-cmd:` env (`trajflow/envs/agent_cmd.py`) on the host: small `#!/bin/sh` programs in a stand-in user layer
(TRAJFLOW_USERENV_DIR) talk to the endpoint through a python3 helper beside them (urllib, no curl) and write the reward
file, while the test drives reset/step; and one such program through the runner's real Unix socket."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_agent_env import _failure, _gone
from tests.unit.test_envs_runner import Client, _wait_for_socket, runner
from trajflow.envs.agent_cmd import CommandAgentEnv

POST = r"""
import json, os, sys, urllib.request

# the conversation so far lives in the program's cwd: each request extends it, as an agent's would
past = json.load(open("conversation.json")) if os.path.exists("conversation.json") else []
past.append({"role": "user", "content": sys.argv[1]})
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps({"messages": past}).encode(),
    headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
)
with urllib.request.urlopen(request, timeout=20) as response:
    said = json.load(response)["choices"][0]["message"]["content"]
json.dump(past + [{"role": "assistant", "content": said}], open("conversation.json", "w"))
print(said)
"""
PROGRAMS = {
    # two calls; checks its cwd is fresh and empty and its stdin closed; records SigIgn to check SIGPIPE's default
    "talk.sh": r"""#!/bin/sh
here=$(dirname "$0")
[ -z "$(ls -A .)" ] || exit 8
if read -r line; then exit 7; fi
first=$(python3 "$here/post.py" "$TRAJFLOW_AGENT_TASK $TRAJFLOW_AGENT_SEED $*") || exit 3
second=$(python3 "$here/post.py" "sure?") || exit 4
ignored=$(grep SigIgn /proc/$$/status | cut -f2)
[ "$second" = yes ] && reward=1 || reward=0
printf '{"reward": %s, "info": {"first": "%s", "ignored": "%s"}}' "$reward" "$first" "$ignored" \
    > "$TRAJFLOW_AGENT_REWARD_FILE"
""",
    "fail.sh": '#!/bin/sh\necho "cannot go on: $1" >&2\nexit 3\n',
    "silent.sh": '#!/bin/sh\npython3 "$(dirname "$0")/post.py" hello > /dev/null\n',
    "killed.sh": "#!/bin/sh\nkill -9 $$\n",
    "hang.sh": '#!/bin/sh\nsleep 60 &\necho "$$ $!" > "$1"\nwait\n',
    "number.sh": '#!/bin/sh\necho 0.75 > "$TRAJFLOW_AGENT_REWARD_FILE"\n',
    "no_shebang": "echo a text file with an execute bit but no #! line\n",
}
TIMEOUT_S = 5.0


@pytest.fixture()
def make_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., CommandAgentEnv]]:
    """CommandAgentEnv(FILE, ...) with PROGRAMS (executable) and post.py in a stand-in user layer; at the end every
    env is closed and no endpoint or exit-watcher thread is left."""
    layer = tmp_path / "layer"
    layer.mkdir()
    (layer / "post.py").write_text(POST)
    for name, text in PROGRAMS.items():
        (layer / name).write_text(text)
        (layer / name).chmod(0o755)
    (layer / "plain.py").write_text("#!/usr/bin/env python3\nimport os\nprint(os.environ['TRAJFLOW_AGENT_SEED'])\n")
    with open(layer / "plain.py", "a") as f:  # no execute bit: run through its #! line
        f.write("open(os.environ['TRAJFLOW_AGENT_REWARD_FILE'], 'w').write('{\"reward\": 0.5}')\n")
    monkeypatch.setenv("TRAJFLOW_USERENV_DIR", str(layer))
    made: list[CommandAgentEnv] = []

    def make(file: str, **kwargs: Any) -> CommandAgentEnv:
        made.append(CommandAgentEnv(file, **kwargs))
        return made[-1]

    yield make
    for env in made:
        env.close()
    assert [t.name for t in threading.enumerate() if t.name.startswith("agent-")] == []


def test_a_shell_program_talks_twice_and_writes_its_reward(make_env: Callable[..., CommandAgentEnv]) -> None:
    env = make_env("talk.sh", task="is it?", args="--flag 'two words'")
    text, info = env.reset(seed=3)
    first = json.loads(text)
    assert first["messages"] == [{"role": "user", "content": '"is it?" 3 --flag two words'}] and info["call"] == 1
    text, reward, terminated, _, info = env.step("maybe")
    contents = [m["content"] for m in json.loads(text)["messages"]]
    assert contents == ['"is it?" 3 --flag two words', "maybe", "sure?"] and (reward, terminated) == (0.0, False)
    text, reward, terminated, _, info = env.step("yes")
    assert (text, reward, terminated) == ("", 1.0, True)
    assert info["first"] == "maybe" and info["exit_status"] == 0 and info["call"] == 2
    assert int(info["ignored"], 16) & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1)) == 0, (
        "the program inherited Python's ignored SIGPIPE/SIGXFSZ"
    )
    assert env.pid is None


def test_a_number_in_the_reward_file_and_a_shebang_without_execute_bit(
    make_env: Callable[..., CommandAgentEnv],
) -> None:
    _, info = make_env("number.sh").reset(seed=0)
    assert info["terminated"] and info["reward"] == 0.75
    env = make_env("plain.py")
    assert env.argv[:2] == ["/usr/bin/env", "python3"]
    _, info = env.reset(seed=0)
    assert info["terminated"] and info["reward"] == 0.5


def test_a_non_zero_status_is_crashed_with_its_stderr(make_env: Callable[..., CommandAgentEnv]) -> None:
    error = _failure(lambda: make_env("fail.sh", args="disk").reset(seed=0))
    assert error.agent_kind == "crashed" and "fail.sh exited with status 3" in error.message
    assert "cannot go on: disk" in error.message
    error = _failure(lambda: make_env("killed.sh").reset(seed=0))
    assert error.agent_kind == "crashed" and f"was killed by signal {int(signal.SIGKILL)}" in error.message
    error = _failure(lambda: make_env("no_shebang").reset(seed=0))
    assert error.agent_kind == "crashed" and "exited with status 127" in error.message
    assert "cannot run" in error.message and "Exec format error" in error.message


def test_status_zero_without_a_reward_file_is_a_bad_result(make_env: Callable[..., CommandAgentEnv]) -> None:
    env = make_env("silent.sh")
    env.reset(seed=0)
    error = _failure(lambda: env.step("hi"))
    assert error.agent_kind == "bad_result" and "silent.sh exited with status 0 without writing its reward file" in (
        error.message
    )


def test_a_hanging_command_is_killed_with_its_group(make_env: Callable[..., CommandAgentEnv], tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    env = make_env("hang.sh", args=str(pids), budget_s=1.0)
    start = time.monotonic()
    error = _failure(lambda: env.reset(seed=0))
    assert error.agent_kind == "hung" and 1.0 <= time.monotonic() - start < 3.0
    program, child = (int(pid) for pid in pids.read_text().split())
    assert _gone(program) and _gone(child), "the program's process group outlived it"


@pytest.mark.parametrize(
    ("file", "kwargs", "says"),
    [
        ("absent.sh", {}, "does not exist"),
        ("post.py", {}, "neither executable nor a script with a #! line"),
        ("../x", {}, ". or .. parts"),
        ("talk.sh", {"args": 3}, "args must be a string"),
        ("talk.sh", {"budget_s": 0}, "budget_s must be a positive number"),
    ],
)
def test_a_bad_command_is_refused_before_it_runs(
    make_env: Callable[..., CommandAgentEnv], file: str, kwargs: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        make_env(file, **kwargs)


def test_a_command_through_the_runner(make_env: Callable[..., CommandAgentEnv], tmp_path: Path) -> None:
    path = tmp_path / "env.sock"
    env = {**os.environ, "TMPDIR": str(tmp_path), "TRAJFLOW_ENV_HINT": "agent-cmd:talk.sh"}  # the layer: the fixture's
    proc = subprocess.Popen([sys.executable, str(runner()), str(path)], env=env)
    try:
        _wait_for_socket(path, proc)
        client = Client(path, timeout_s=TIMEOUT_S * 2)
        out = client(op="reset", env_id="agent-cmd:talk.sh", seed=1, env_kwargs={"task": "t", "args": "-x"})
        assert out["ok"] and json.loads(out["observation"])["messages"][0]["content"] == '"t" 1 -x'
        assert client(op="step", action="four")["ok"]
        out = client(op="step", action="yes")
        assert out["ok"] and out["terminated"] and out["reward"] == 1.0 and out["info"]["exit_status"] == 0
        out = client(op="reset", env_id="agent-cmd:fail.sh", seed=2)
        assert out["error"]["type"] == "AgentError" and out["error"]["kind"] == "crashed"
        out = client(op="reset", env_id="agent-cmd:absent.sh", seed=0)
        assert out["error"]["type"] == "BadRequest" and "does not exist" in out["error"]["message"]
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 128 + signal.SIGTERM
