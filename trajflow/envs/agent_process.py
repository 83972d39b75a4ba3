"""The process side of an agent env (`agent.py`, `agent_cmd.py`, `agent_verify.py`): the bootstraps' common start
(`GUARD`: the guard process, the result pipe kept from what the bootstrap execs, not dumpable) and call (`CALL`), the
result pipe (`ResultPipe`), starting a bootstrap (`spawn`), killing and reaping its process group (`kill_group`), the
environment a user's program gets (`user_environment`), and the failures (`AgentError`). Limits: stdlib only (it runs
beside the runner in the sandbox).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

STDERR_TAIL = 2000
MAX_RESULT_BYTES = 16 * 1024 * 1024
"""The most a result pipe keeps (a return value or verdict as JSON); more is a bad result."""
REAP_S = 2.0
"""How long closing waits for the killed group's members orphaned to the runner to be reaped."""
USERENV_DIR = "/opt/trajflow/userenv"
KINDS = ("crashed", "hung", "malformed_request", "bad_result")

GUARD = r"""
import json, os, sys

spec = json.load(open(sys.argv[1]))
out = spec.get("out")
if isinstance(out, int):  # the result pipe's write end: closed in every program this process execs
    os.set_inheritable(out, False)
if os.fork() == 0:  # the guard: once the runner's end of the pipe closes (the runner died), it ends the group
    if isinstance(out, int):
        os.close(out)
    try:
        os.read(spec["guard"], 1)
    finally:
        os.killpg(0, 9)
os.close(spec["guard"])
try:  # not dumpable: another process of the sandbox's user cannot open this one's pipes through /proc/PID/fd
    import ctypes
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
except (ImportError, OSError, AttributeError):
    pass
"""
"""The start of every bootstrap (this one's, `agent_cmd.py`'s and `agent_verify.py`'s): it forks the guard and makes
the process undumpable (an exec resets that for the programs it runs)."""
CALL = r"""
import asyncio, importlib


def call(module, function, args, out):  # FUNCTION(*args) of MODULE, awaited if async: {"value": ...} to the fd `out`
    sys.argv = [module]
    value = getattr(importlib.import_module(module), function)(*args)
    if asyncio.iscoroutine(value):
        value = asyncio.run(value)
    try:
        text = json.dumps({"value": value}, allow_nan=False)
    except (TypeError, ValueError):
        text = json.dumps({"unserializable": repr(value)[:1000]})
    view = memoryview(text.encode())
    while view:
        view = view[os.write(out, view):]
    os.close(out)
"""
"""After GUARD in the bootstraps that call a user's function (this one's, `agent_verify.py`'s): `call(...)`."""


class ResultPipe:
    """The channel of a bootstrap's result (`call`'s JSON) to the runner: a pipe whose write end only the bootstrap
    holds (not inherited by what it execs, closed in the guard, unreachable through /proc as the bootstrap is not
    dumpable), so no command the model makes the program run can write it, as it could a file of the same user. A
    thread drains the read end until EOF (at most MAX_RESULT_BYTES kept); `outcome` reads what came."""

    def __init__(self) -> None:
        self._read, self.write_fd = os.pipe()
        self._data = bytearray()
        self._over = False
        self._thread = threading.Thread(target=self._drain, name="agent-result", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        with open(self._read, "rb", buffering=0, closefd=True) as pipe:
            while chunk := pipe.read(65536):
                if len(self._data) + len(chunk) > MAX_RESULT_BYTES:
                    self._over = True
                else:
                    self._data += chunk

    def join(self, wait_s: float = REAP_S) -> bool:
        """Wait for EOF (every holder of the write end gone) up to `wait_s`; whether it came."""
        self._thread.join(wait_s)
        return not self._thread.is_alive()

    def sent(self) -> None:
        """The child has the write end: close ours, so that EOF comes when the child's last holder closes it."""
        os.close(self.write_fd)

    def outcome(self, source: str, wait_s: float = REAP_S) -> dict[str, Any] | None:
        """The result, once every holder of the write end is gone (None: nothing was sent); raises
        AgentError(bad_result) when what came is not one result of `call`."""
        if not self.join(wait_s):
            raise AgentError("bad_result", f"{source}: its result pipe was still open {wait_s:g} s after it ended")
        if not self._data and not self._over:
            return None
        try:
            outcome = json.loads(self._data) if not self._over else None
        except ValueError:
            outcome = None
        if not isinstance(outcome, dict) or len(outcome) != 1 or not {"value", "unserializable"} & set(outcome):
            said = f"over {MAX_RESULT_BYTES} bytes" if self._over else f"{bytes(self._data[:200])!r}"
            raise AgentError("bad_result", f"{source}: its result pipe carried something else than one result: {said}")
        return outcome


class AgentError(Exception):
    """The agent program failed; `agent_kind` is one of KINDS."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.agent_kind = kind
        self.message = message


def spawn(
    bootstrap: str, spec: Path, cwd: Path, env: dict[str, str], log: Path, guard: int, result: ResultPipe
) -> subprocess.Popen[bytes]:
    """`python -c BOOTSTRAP SPEC` in its own session and process group, stdin closed, stdout discarded, stderr to
    `log`, holding the guard pipe's read end `guard` and the write end of `result`."""
    with open(log, "wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-c", bootstrap, str(spec)],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
            pass_fds=(guard, result.write_fd),
        )


def crashed(status: int, stderr: str, program: str = "the agent program", how: str = "{}") -> AgentError:
    """The `crashed` error of a program that exited with `status` (negative: killed by that signal)."""
    ended = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
    return AgentError("crashed", f"{program} {how.format(ended)}; the end of its stderr:\n{stderr}")


def user_environment(seed: int) -> dict[str, str]:
    """The runner's environment as a user's program (or verifier) gets it: the layer first on PYTHONPATH, hash seed."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": str(seed % 2**32)}
    layer = os.environ.get("TRAJFLOW_USERENV_DIR", USERENV_DIR)
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if os.path.isdir(layer) and layer not in path:
        env["PYTHONPATH"] = os.pathsep.join([layer, *path])
    return env


def kill_group(proc: subprocess.Popen[bytes], reap_s: float = REAP_S) -> None:
    """SIGKILL the program's process group (its children too) and reap it: the program, and the members orphaned to
    this process, as they are to a runner that is its container's PID 1 (left unreaped, each zombie would hold one of
    the sandbox's few pids for good)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already
    proc.wait()
    deadline = time.monotonic() + reap_s
    while time.monotonic() < deadline:
        try:
            if os.waitpid(-proc.pid, os.WNOHANG) == (0, 0):
                time.sleep(0.01)  # a member of ours is still dying
        except ChildProcessError:
            return  # no child of this process is left in the group
