"""The env runner's protocol, driven over a real Unix socket with the runner as a host subprocess."""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trajflow.envs.runner import json_safe_info


@functools.cache
def runner() -> Path:
    """The runner beside its siblings as the runtime image holds them (`images.runtime_sources`: the env modules and
    the contracts' env id prefixes in one flat directory), written once per test process."""
    from trajflow.sandbox import images

    home = Path(tempfile.mkdtemp(prefix="tf-runtime-"))
    for name, data in images.runtime_sources().items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_bytes(data)
    return home / "runner.py"


GUESS = "game:GuessTheNumber-v0-easy"
RG = "rg:basic_arithmetic"


class Client:
    """One connection to the runner: send a request line, read one answer line."""

    def __init__(self, path: Path, timeout_s: float = 60.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rwb")

    def send_raw(self, line: bytes) -> dict[str, Any]:
        self.file.write(line)
        self.file.flush()
        answer: dict[str, Any] = json.loads(self.file.readline())
        return answer

    def __call__(self, **request: Any) -> dict[str, Any]:
        return self.send_raw(json.dumps(request).encode() + b"\n")

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def _wait_for_socket(path: Path, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"runner exited early with {proc.returncode}"
        if path.exists():
            return
        time.sleep(delay)  # bounded polling for the runner to bind
        delay = min(delay * 2, 0.1)
    raise AssertionError(f"runner did not bind {path} within {timeout_s}s")


@pytest.fixture(scope="module")
def socket_path() -> Iterator[Path]:
    workdir = Path(tempfile.mkdtemp(prefix="tf-runner-"))
    path = workdir / "env.sock"
    proc = subprocess.Popen([sys.executable, str(runner()), str(path)])
    try:
        _wait_for_socket(path, proc)
        yield path
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture()
def client(socket_path: Path) -> Iterator[Client]:
    c = Client(socket_path)
    yield c
    c.close()


def test_ping(client: Client) -> None:
    answer = client(op="ping")
    assert answer["ok"] is True
    assert isinstance(answer["loaded"], bool)


def test_guess_the_number_reset_and_step(client: Client) -> None:
    reset = client(op="reset", env_id=GUESS, seed=1, env_kwargs={})
    assert reset["ok"] is True
    assert "Guess The Number" in reset["observation"]
    assert reset["info"] == {"suffix": "Enter your next guess."}
    step = client(op="step", action="\\boxed{5}")
    assert step == {
        "ok": True,
        "observation": "At turn 1, you guessed 5, and the target number is lower than 5.",
        "reward": 0.0,
        "terminated": False,
        "truncated": False,
        "info": {"suffix": "Enter your next guess."},
    }
    win = client(op="step", action="\\boxed{3}")
    assert win["terminated"] is True and win["reward"] == 1.0


def test_same_seed_same_episode(client: Client) -> None:
    first = [client(op="reset", env_id=GUESS, seed=7)["observation"]]
    first += [client(op="step", action=f"\\boxed{{{n}}}")["observation"] for n in (5, 8)]
    second = [client(op="reset", env_id=GUESS, seed=7)["observation"]]
    second += [client(op="step", action=f"\\boxed{{{n}}}")["observation"] for n in (5, 8)]
    assert first == second


def test_reasoning_gym_env(client: Client) -> None:
    reset = client(op="reset", env_id=RG, seed=3)
    assert reset["ok"] is True
    assert reset["observation"].startswith("Calculate")
    expression = reset["observation"].removeprefix("Calculate").strip().rstrip(".")
    answer = eval(expression, {"__builtins__": {}})  # a plain sum of integers
    step = client(op="step", action=f"\\boxed{{{answer}}}")
    assert step["ok"] is True and step["reward"] == 1.0 and step["terminated"] is True


def test_unknown_env(client: Client) -> None:
    answer = client(op="reset", env_id="game:NoSuchGame-v0", seed=0)
    assert answer["ok"] is False
    assert answer["error"]["type"] == "UnknownEnv"
    assert "game:NoSuchGame-v0" in answer["error"]["message"]


def test_gym_env_through_the_runner(client: Client) -> None:
    """A `gym:` env runs beside the runner as it does in the image (a script importing its sibling modules)."""
    reset = client(op="reset", env_id="gym:FrozenLake-v1", seed=0, env_kwargs={"is_slippery": False})
    assert reset["ok"] is True and reset["info"] == {"prob": 1}
    assert reset["observation"].startswith("You are playing Frozen Lake.")
    step = client(op="step", action="\\boxed{right}")
    assert step == {
        "ok": True,
        "observation": "You moved right. You are at row 1, column 2.\nS @ F F\nF H F H\nF F F H\nH F F G",
        "reward": 0.0,
        "terminated": False,
        "truncated": False,
        "info": {"prob": 1.0},
    }
    bad = client(op="step", action="right")
    assert (
        bad["ok"] is True
        and bad["reward"] == -0.1
        and bad["terminated"] is True
        and "valid action" in bad["observation"]
    )
    after = client(op="step", action="\\boxed{right}")
    assert (
        after["ok"] is False and after["error"]["type"] == "EnvError" and "episode is over" in after["error"]["message"]
    )


@pytest.mark.parametrize(
    ("env_id", "env_kwargs", "kind", "needle"),
    [
        ("gym:NoSuchEnv-v0", {}, "UnknownEnv", "no gymnasium environment 'NoSuchEnv-v0'"),
        ("gym:Taxi-v4", {}, "EnvError", "has no text interface"),
        ("gym:FrozenLake-v1", {"slippery": True}, "BadRequest", "bad env_kwargs"),
    ],
)
def test_gym_env_errors_are_answers(
    client: Client, env_id: str, env_kwargs: dict[str, Any], kind: str, needle: str
) -> None:
    answer = client(op="reset", env_id=env_id, seed=0, env_kwargs=env_kwargs)
    assert answer["ok"] is False and answer["error"]["type"] == kind and needle in answer["error"]["message"]
    assert client(op="ping")["ok"] is True


def test_exception_in_env_code_is_an_env_error(client: Client) -> None:
    bad_make = client(op="reset", env_id=GUESS, seed=1, env_kwargs={"min_number": "a"})
    assert bad_make["ok"] is False and bad_make["error"]["type"] == "EnvError"
    assert client(op="reset", env_id=GUESS, seed=1, env_kwargs={"max_turns": "x"})["ok"] is True
    bad_step = client(op="step", action="\\boxed{5}")  # compares an int turn count with "x"
    assert bad_step["ok"] is False and bad_step["error"]["type"] == "EnvError"
    assert "TypeError" in bad_step["error"]["message"]
    assert client(op="ping")["ok"] is True  # the runner survived


def test_step_before_reset_is_a_bad_request() -> None:
    # A fresh runner process: the shared one may already hold an env from another test.
    workdir = Path(tempfile.mkdtemp(prefix="tf-runner-"))
    path = workdir / "env.sock"
    proc = subprocess.Popen([sys.executable, str(runner()), str(path)], env={"TRAJFLOW_LAZY_IMPORT": "1"})
    try:
        _wait_for_socket(path, proc)
        c = Client(path)
        answer = c(op="step", action="\\boxed{1}")
        assert answer["ok"] is False and answer["error"]["type"] == "BadRequest"
        c.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        (b"{not json\n", "not valid JSON"),
        (b"[1, 2]\n", "JSON object"),
        (b'{"op": "fly"}\n', "unknown op"),
        (b'{"op": "reset", "seed": 1}\n', "env_id"),
        (b'{"op": "reset", "env_id": "x", "seed": "1"}\n', "seed"),
        (b'{"op": "step"}\n', "action"),
    ],
)
def test_bad_requests(client: Client, line: bytes, needle: str) -> None:
    answer = client.send_raw(line)
    assert answer["ok"] is False
    assert answer["error"]["type"] == "BadRequest"
    assert needle in answer["error"]["message"]


def test_reconnect_keeps_the_environment(socket_path: Path) -> None:
    first = Client(socket_path)
    assert first(op="reset", env_id=GUESS, seed=1)["ok"] is True
    first.close()
    second = Client(socket_path)
    assert second(op="step", action="\\boxed{3}")["reward"] == 1.0
    second.close()


def test_sleep_hook(client: Client) -> None:
    started = time.monotonic()
    assert client(op="sleep", seconds=0.05) == {"ok": True}
    assert time.monotonic() - started >= 0.05


def test_json_safe_info() -> None:
    info = {"a": 1, "b": 2.5, "c": "s", "d": None, "e": True, "f": [1, 2], "g": "x" * 5, 3: object()}
    safe = json_safe_info(info)
    assert safe["a"] == 1 and safe["b"] == 2.5 and safe["c"] == "s" and safe["d"] is None and safe["e"] is True
    assert safe["f"] == "[1, 2]"
    assert isinstance(safe["3"], str)
    assert json_safe_info({"big": ["y" * 2000]})["big"] == str(["y" * 2000])[:1000]
    assert json_safe_info(None) == {}
    json.dumps(safe)


def test_a_runner_started_for_a_game_skips_reasoning_gym(tmp_path: Path) -> None:
    """With an env hint other than `rg:`, GEM loads without reasoning_gym (and sympy): games work, `rg:` ids are
    refused clearly, and the import is much lighter."""
    import os

    path = tmp_path / "env.sock"
    proc = subprocess.Popen([sys.executable, str(runner()), str(path)], env={**os.environ, "TRAJFLOW_ENV_HINT": GUESS})
    try:
        _wait_for_socket(path, proc)
        c = Client(path)
        out = c(op="reset", env_id=GUESS, seed=3)
        assert out["ok"] and "Guess The Number" in out["observation"]
        step = c(op="step", action="\\boxed{5}")
        assert step["ok"]
        refused = c(op="reset", env_id=RG, seed=0)
        assert not refused["ok"] and refused["error"]["type"] == "BadRequest" and RG in refused["error"]["message"]
        c.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    from trajflow.envs.runner import GemLoader

    assert GemLoader(GUESS).light and not GemLoader(RG).light and not GemLoader("").light


def test_a_runner_started_for_a_gym_env_imports_no_gem(tmp_path: Path) -> None:
    import os

    path = tmp_path / "env.sock"
    hint = "gym:Blackjack-v1"
    proc = subprocess.Popen([sys.executable, str(runner()), str(path)], env={**os.environ, "TRAJFLOW_ENV_HINT": hint})
    try:
        _wait_for_socket(path, proc)
        c = Client(path)
        out = c(op="reset", env_id=hint, seed=3)
        assert out["ok"] and out["observation"].startswith("You are playing Blackjack")
        assert c(op="ping")["loaded"] is False  # GEM was never imported
        c.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("host_side_only", [True, False], ids=["in-a-sandbox", "elsewhere"])
def test_a_runner_in_a_sandbox_refuses_connections_from_inside_it(tmp_path: Path, host_side_only: bool) -> None:
    """As its sandbox's PID 1 the runner serves only peers outside its pid namespace (SO_PEERCRED pid 0): this
    process, in the runner's own namespace, is refused with one error line and disconnected. Elsewhere (a runner
    started by hand, these tests) anyone who can reach the socket is served. The real namespaces: the Docker test
    `test_a_tool_command_in_a_sandbox_cannot_drive_the_runner`."""
    from trajflow.envs.gem_loader import GemLoader
    from trajflow.envs.runner import EnvHost, _Server, peer_pid

    path = tmp_path / "env.sock"
    server = _Server(str(path), EnvHost(GemLoader("")), host_side_only=host_side_only)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    client = Client(path, timeout_s=10)
    try:
        assert peer_pid(client.sock) == os.getpid()  # the runner, here this process, as its peer sees it
        answer = client(op="ping")
        if host_side_only:
            assert answer["ok"] is False and answer["error"]["type"] == "BadRequest", answer
            assert f"process {os.getpid()} is inside the sandbox" in answer["error"]["message"]
            assert client.file.readline() == b""  # disconnected
        else:
            assert answer == {"ok": True, "loaded": False}
    finally:
        client.close()
        server.shutdown()
        server.server_close()
