"""Hosts ONE environment (GEM; a shell task: `shell:<task>`, see `trajflow/envs/shell.py`; a gymnasium env through its
text interface: `gym:<ID>`, see `trajflow/envs/gym_adapter.py`; a user's own env class: `py:MODULE:CLASS`; a dataset
task: `data:NAME`, see `trajflow/envs/dataset.py`; or a user's agent program whose every chat request is a turn:
`agent:MODULE:FUNCTION`, see `trajflow/envs/agent.py`, or a command line `agent-cmd:FILE`, see
`trajflow/envs/agent_cmd.py`) behind a Unix socket: the program a sandbox container runs.

Protocol: newline-delimited JSON, one request -> one response line, sequential per connection. Several
connections may be open (a host that lost its connection reconnects); they share the one environment,
and a lock serialises the operations.

    {"op": "ping"}                                            -> {"ok": true, "loaded": bool}
    {"op": "reset", "env_id": str, "seed": int, "env_kwargs": {}}
                                                              -> {"ok": true, "observation": str, "info": {}}
    {"op": "step", "action": str}                             -> {"ok": true, "observation": str, "reward": float,
                                                                  "terminated": bool, "truncated": bool, "info": {}}
    {"op": "sleep", "seconds": float}                         -> {"ok": true}   (test hook: a slow step)

Failures are answers, never crashes: `{"ok": false, "error": {"type": "EnvError" | "UnknownEnv" |
"BadRequest", "message": str}}`; an agent program's failure is `{"type": "AgentError", "kind": "crashed" | "hung" |
"malformed_request" | "bad_result", "message": str}`. Info dicts are made JSON-safe (scalars kept, anything else
stringified and cut to 1000 characters).

Limits: stdlib only; `gem` is imported in a background thread (`gem_loader.py`) as soon as the runner starts (so
the socket is up at once and the import overlaps the host's readiness wait), and a `reset` waits for that import.
GEM's registry imports reasoning_gym (and with it sympy: ~1.2 CPU-seconds, 6x the rest of the import) only
to list the `rg:` ids; when the container is started for another env (`TRAJFLOW_ENV_HINT`, set by the env
worker), a stand-in that lists no `rg:` ids is used instead, and such a sandbox refuses `rg:` ids.
A shell task or a `gym:` env imports no GEM (their modules are imported at their first reset; gymnasium's
import takes ~0.1 s). No authentication; access: the socket's directory, and where the runner is its sandbox's PID 1,
only peers outside its pid namespace (the host side): a process inside the sandbox (an agent's tool command, say) gets
one error line and is disconnected. One environment per process.
SIGTERM ends the runner after closing its env (an agent program's process group is killed with it).

Usage: `python3 runner.py [SOCKET_PATH]` (or env `TRAJFLOW_ENV_SOCKET`; default `/run/trajflow/env.sock`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

if __package__:
    from trajflow.contracts import env_ids
    from trajflow.envs.gem_loader import GemLoader, GemUnavailable
else:  # beside the runner in the sandbox image (`env_ids.py` is the contracts' file, copied there)
    import env_ids  # pyright: ignore[reportMissingImports]
    from gem_loader import GemLoader, GemUnavailable

DEFAULT_SOCKET = "/run/trajflow/env.sock"
MAX_INFO_CHARS = 1000
MAX_SLEEP_S = 3600.0
REFUSED_LINE_BYTES, REFUSED_WAIT_S = 65536, 5.0  # how much of a refused peer's first line is read, and how long for
USERENV_DIR = "/opt/trajflow/userenv"
"""Where a user env layer holds its package (`trajflow/sandbox/user_images.py`; env TRAJFLOW_USERENV_DIR overrides)."""
STEP_RESULT = "(observation, reward, terminated, truncated, info)"
Response = dict[str, Any]


class RequestError(Exception):
    """A request that gets an `ok: false` answer; `kind` is the error type the host sees."""

    def __init__(self, kind: str, message: str, agent_kind: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.agent_kind = agent_kind
        """An AgentError's kind (`trajflow/envs/agent.py`)."""


def json_safe_info(info: object) -> dict[str, Any]:
    """Keep str/int/float/bool/None values; stringify anything else (keys too), cut to 1000 chars."""
    if not isinstance(info, dict):
        return {}
    safe: dict[str, Any] = {}
    for key, value in info.items():
        if value is None or isinstance(value, (str, int, float, bool)):
            safe[str(key)] = value
        else:
            safe[str(key)] = str(value)[:MAX_INFO_CHARS]
    return safe


class EnvHost:
    """The one environment of this process and the operations on it."""

    def __init__(self, loader: GemLoader) -> None:
        self._loader = loader
        self._env: Any = None
        self._lock = threading.Lock()

    def handle(self, request: object) -> Response:
        if not isinstance(request, dict):
            raise RequestError("BadRequest", "a request must be a JSON object")
        op = request.get("op")
        if op == "ping":
            return {"ok": True, "loaded": self._loader.loaded}
        if op == "sleep":
            seconds = _field(request, "seconds", (int, float))
            time.sleep(min(max(float(seconds), 0.0), MAX_SLEEP_S))
            return {"ok": True}
        with self._lock:
            if op == "reset":
                return self._reset(request)
            if op == "step":
                return self._step(request)
        raise RequestError("BadRequest", f"unknown op {op!r}; expected ping, reset, step or sleep")

    def _reset(self, request: dict[str, Any]) -> Response:
        env_id = _field(request, "env_id", str)
        seed = _field(request, "seed", int)
        env_kwargs = request.get("env_kwargs") or {}
        if not isinstance(env_kwargs, dict):
            raise RequestError("BadRequest", "env_kwargs must be a JSON object")
        if env_id.startswith(env_ids.SHELL_PREFIX):
            return self._reset_shell(env_id[len(env_ids.SHELL_PREFIX) :], seed, env_kwargs)
        if env_id.startswith(env_ids.USER_PREFIX):
            return self._reset_user(env_id, seed, env_kwargs)
        if env_id.startswith(env_ids.DATA_PREFIX):
            return self._reset_data(env_id[len(env_ids.DATA_PREFIX) :], seed, env_kwargs)
        if env_id.startswith(env_ids.GYM_PREFIX):
            return self._reset_gym(env_id[len(env_ids.GYM_PREFIX) :], seed, env_kwargs)
        if env_id.startswith(env_ids.AGENT_PREFIXES):
            return self._reset_agent(env_id, seed, env_kwargs)
        if self._loader.light and env_id.startswith("rg:"):
            raise RequestError("BadRequest", f"this sandbox was started for a non-rg env and cannot host {env_id!r}")
        try:
            gem = self._loader.get()
        except GemUnavailable as e:
            raise RequestError("EnvError", str(e)) from e
        from gem.envs.registration import ENV_REGISTRY  # gem is loaded by now

        if env_id not in ENV_REGISTRY:
            raise RequestError("UnknownEnv", f"no GEM environment is registered as {env_id!r}")
        self._drop_env()
        try:
            env = gem.make(env_id, **env_kwargs)
        except Exception as e:
            raise RequestError("EnvError", _describe(e, f"reset of {env_id!r} failed")) from e
        return self._begin(env, seed, repr(env_id))

    def _reset_shell(self, task: str, seed: int, env_kwargs: dict[str, Any]) -> Response:
        shell = _sibling("shell")
        self._drop_env()
        try:
            env = shell.ShellEnv(task, **env_kwargs)
        except shell.ShellTaskError as e:
            raise RequestError("UnknownEnv", str(e)) from e
        except TypeError as e:
            raise RequestError("BadRequest", f"bad env_kwargs for a shell task: {e}") from e
        return self._begin(env, seed, f"shell task {task!r}")

    def _reset_user(self, env_id: str, seed: int, env_kwargs: dict[str, Any]) -> Response:
        module_name, _, cls_name = env_id[len(env_ids.USER_PREFIX) :].partition(":")
        self._drop_env()
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and (module_name + ".").startswith(e.name + "."):
                raise RequestError("UnknownEnv", f"no module {module_name!r} in this sandbox's image") from e
            raise RequestError(
                "EnvError",
                _describe(e, f"import of {module_name!r} failed (a requirement missing from its requirements.txt?)"),
            ) from e
        except Exception as e:
            raise RequestError("EnvError", _describe(e, f"import of {module_name!r} failed")) from e
        cls: Any = getattr(module, cls_name, None)
        if not callable(cls):
            raise RequestError("UnknownEnv", f"module {module_name!r} has no class {cls_name!r}")
        try:
            env: Any = cls(**env_kwargs)
        except TypeError as e:
            raise RequestError("BadRequest", f"bad env_kwargs for {env_id}: {e}") from e
        except Exception as e:
            raise RequestError("EnvError", _describe(e, f"{env_id}: {cls_name}(**env_kwargs) failed")) from e
        try:
            out = env.reset(seed=seed)
        except Exception as e:
            raise RequestError("EnvError", _describe(e, f"reset of {env_id!r} failed")) from e
        observation, info = out if isinstance(out, tuple) and len(out) == 2 else (out, {})
        if not isinstance(observation, str):
            raise RequestError(
                "EnvError", f"{env_id}: reset returned a {type(observation).__name__} observation; a py: env's are str"
            )
        self._env = env
        return {"ok": True, "observation": observation, "info": json_safe_info(info)}

    def _reset_data(self, name: str, seed: int, env_kwargs: dict[str, Any]) -> Response:
        dataset = _sibling("dataset")
        root = Path(os.environ.get("TRAJFLOW_USERENV_DIR", USERENV_DIR))
        path = next(
            (root / f"{name}{suffix}" for suffix in dataset.SUFFIXES if (root / f"{name}{suffix}").is_file()), None
        )
        if path is None:
            raise RequestError("UnknownEnv", f"no dataset {name!r} in this sandbox's image ({root})")
        self._drop_env()
        try:
            env = dataset.DatasetEnv(path, **env_kwargs)
        except (TypeError, ValueError) as e:
            kind = "EnvError" if isinstance(e, dataset.DatasetError) else "BadRequest"
            raise RequestError(kind, f"data:{name}: {e}") from e
        return self._begin(env, seed, f"dataset {name!r}")

    def _reset_gym(self, name: str, seed: int, env_kwargs: dict[str, Any]) -> Response:
        self._drop_env()
        try:
            adapter = _sibling("gym_adapter")  # imports gymnasium
        except ImportError as e:
            raise RequestError("EnvError", f"cannot import gymnasium: {type(e).__name__}: {e}") from e
        try:
            env = adapter.GymTextEnv(name, **env_kwargs)
        except adapter.UnknownGymEnv as e:
            raise RequestError("UnknownEnv", str(e)) from e
        except adapter.NoTextInterface as e:
            raise RequestError("EnvError", str(e)) from e
        except TypeError as e:  # gymnasium hands env_kwargs to the env's constructor
            raise RequestError("BadRequest", f"bad env_kwargs for gymnasium environment {name!r}: {e}") from e
        except Exception as e:
            raise RequestError("EnvError", _describe(e, f"making gymnasium environment {name!r} failed")) from e
        return self._begin(env, seed, f"gymnasium environment {name!r}")

    def _reset_agent(self, env_id: str, seed: int, env_kwargs: dict[str, Any]) -> Response:
        command = env_id.startswith(env_ids.AGENT_CMD_PREFIX)
        agent = _sibling("agent_cmd" if command else "agent")
        self._drop_env()
        try:
            if command:
                env = agent.CommandAgentEnv(env_id[len(env_ids.AGENT_CMD_PREFIX) :], **env_kwargs)
            else:
                env = agent.AgentEnv(env_id[len(env_ids.AGENT_PREFIX) :], **env_kwargs)
        except (TypeError, ValueError) as e:
            raise RequestError("BadRequest", f"bad env id or env_kwargs for {env_id}: {e}") from e
        try:
            observation, info = env.reset(seed=seed)
        except Exception as e:
            env.close()
            raise _env_failure(e, f"reset of {env_id!r} failed") from e
        self._env = env
        return {"ok": True, "observation": observation, "info": json_safe_info(info)}

    def _drop_env(self) -> None:
        """Forget the env; one that owns processes (an agent program, its endpoint) is closed first."""
        env, self._env = self._env, None
        if getattr(env, "owns_processes", False):
            env.close()

    def close(self) -> None:
        """The runner's teardown: close an env that owns processes."""
        self._drop_env()

    def _begin(self, env: Any, seed: int, what: str) -> Response:
        """Reset `env` with `seed` and make it this host's env: the reset's answer (its failure is the env's)."""
        try:
            observation, info = env.reset(seed=seed)
        except Exception as e:
            raise RequestError("EnvError", _describe(e, f"reset of {what} failed")) from e
        self._env = env
        return {"ok": True, "observation": str(observation), "info": json_safe_info(info)}

    def _step(self, request: dict[str, Any]) -> Response:
        action = _field(request, "action", str)
        if self._env is None:
            raise RequestError("BadRequest", "step before a successful reset")
        try:
            out = self._env.step(action)
        except Exception as e:
            raise _env_failure(e, "step failed") from e
        if not isinstance(out, tuple) or len(out) != 5:
            got = f"a {len(out)}-tuple" if isinstance(out, tuple) else f"a {type(out).__name__}"
            raise RequestError("EnvError", f"step returned {got}; an env's step returns {STEP_RESULT}")
        observation, reward, terminated, truncated, info = out
        return {
            "ok": True,
            "observation": str(observation),
            "reward": float(reward),
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "info": json_safe_info(info),
        }


def _sibling(name: str) -> ModuleType:
    """`trajflow/envs/<name>.py`: beside this file in the sandbox image, in the `trajflow.envs` package on the host."""
    return importlib.import_module(f"{__package__}.{name}" if __package__ else name)


def _field(request: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = request.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise RequestError("BadRequest", f"field {name!r} is missing or has the wrong type: {value!r}")
    return value


def _describe(error: BaseException, what: str) -> str:
    last = traceback.format_exception(error)[-3:]
    return f"{what}: {type(error).__name__}: {error}\n{''.join(last)}"[:4000]


def _env_failure(error: Exception, what: str) -> RequestError:
    """An env's exception as an answer: an AgentError keeps its kind and message, anything else is an EnvError."""
    agent_kind = getattr(error, "agent_kind", None)
    if isinstance(agent_kind, str):
        return RequestError("AgentError", str(error), agent_kind)
    return RequestError("EnvError", _describe(error, what))


def answer(host: EnvHost, line: bytes) -> Response:
    """The response to one request line; every failure becomes an `ok: false` response."""
    try:
        request = json.loads(line)
    except ValueError as e:
        return _error("BadRequest", f"not valid JSON: {e}")
    try:
        return host.handle(request)
    except RequestError as e:
        return _error(e.kind, e.message, e.agent_kind)
    except Exception as e:
        return _error("EnvError", _describe(e, "runner error"))


def _error(kind: str, message: str, agent_kind: str | None = None) -> Response:
    if agent_kind is not None:
        return {"ok": False, "error": {"type": kind, "kind": agent_kind, "message": message}}
    return {"ok": False, "error": {"type": kind, "message": message}}


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        if self.server.host_side_only and (pid := peer_pid(self.connection)) != 0:
            # a process inside the sandbox: its first line is answered with a refusal, then it is cut off
            message = f"refused: process {pid} is inside the sandbox; only its host side may connect"
            self.connection.settimeout(REFUSED_WAIT_S)
            with contextlib.suppress(OSError):
                self.rfile.readline(REFUSED_LINE_BYTES)
                self.wfile.write((json.dumps(_error("BadRequest", message)) + "\n").encode())
            return
        for line in self.rfile:
            if not line.strip():
                continue
            reply = json.dumps(answer(self.server.host, line)) + "\n"
            self.wfile.write(reply.encode())
            self.wfile.flush()


def peer_pid(connection: socket.socket) -> int:
    """The pid of a Unix socket's peer in this process's pid namespace (SO_PEERCRED): 0 for one outside it."""
    pid, _uid, _gid = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, host: EnvHost, host_side_only: bool) -> None:
        self.host = host
        self.host_side_only = host_side_only
        super().__init__(path, _Handler)


def serve(path: str, *, preload: bool = True) -> None:
    """Listen on `path` until killed."""
    if os.path.exists(path):
        os.unlink(path)  # a stale socket from a previous run of this container
    hint = os.environ.get("TRAJFLOW_ENV_HINT", "")
    loader = GemLoader(hint)
    host = EnvHost(loader)
    # in a sandbox the runner is its pid namespace's first process, and only the host side (outside it) may connect
    server = _Server(path, host, host_side_only=os.getpid() == 1)
    os.chmod(path, 0o666)  # the host side may connect as another user
    if preload and not hint.startswith(env_ids.NO_GEM_PREFIXES):  # shell tasks, gym, user envs and datasets need no GEM
        loader.start()
    try:
        server.serve_forever()
    finally:  # SIGTERM (see main) or an interrupt: an agent program must not outlive its runner
        host.close()


def main(argv: list[str]) -> None:
    path = argv[1] if len(argv) > 1 else os.environ.get("TRAJFLOW_ENV_SOCKET", DEFAULT_SOCKET)
    preload = os.environ.get("TRAJFLOW_LAZY_IMPORT", "") not in ("1", "true")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    serve(path, preload=preload)


if __name__ == "__main__":
    main(sys.argv)
