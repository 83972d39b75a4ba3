"""Starts, talks to and removes sandbox containers, each hosting one environment runner.

A `SandboxManager` starts a container from the runtime image hardened by `SandboxLimits` (no network; CPU,
memory and pids limits; an unprivileged user; a read-only root with small writable tmpfs at /tmp and /work; all
capabilities dropped; no new privileges) and owner labels (see `trajflow.sandbox.labels`), bind-mounts a private host
directory at `/run/trajflow`, and waits (bounded polling) until the runner answers `ping` on its Unix socket. A
`Sandbox` then sends `reset`/`step` over one persistent connection, each with the step timeout.

Errors: a dead container or a broken socket -> `SandboxLost`; a request past its timeout kills the
container -> `SandboxStepTimeout` (a call may name its own timeout: an agent program works up to its budget between
two requests); an `ok: false` answer -> `EnvError` (an agent program's failure keeps its kind); failing to start ->
`SandboxStartError`.
Thread-safety: the manager's registry is locked; each sandbox serialises its own requests, so many sandboxes
may be driven from many threads at once. Sync code: callers run it in threads.
Limits: one Docker engine on this host; the socket path (runtime_dir/<12 hex>/env.sock) must stay under
the 107-byte Unix socket limit; no warm pool here (that is a layer on top).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import docker
import docker.errors
import requests.exceptions

from trajflow.envs.shell import WORK_DIR  # the sandbox's writable work dir (a tmpfs); the root is read-only
from trajflow.sandbox import labels
from trajflow.sandbox.errors import EnvError, SandboxLost, SandboxStartError, SandboxStepTimeout
from trajflow.sandbox.images import RUNNER_SOCKET_DIR, SANDBOX_UID
from trajflow.sandbox.leases import LeaseBook

SOCKET_NAME = "env.sock"
MAX_SOCKET_PATH = 107
_RECV_BYTES = 1 << 16


class ResetReply(TypedDict):
    observation: str
    info: dict[str, Any]


class StepReply(TypedDict):
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


class Sandbox:
    """One running container and its runner; use it from one trajectory (one thread) at a time."""

    def __init__(
        self,
        client: docker.DockerClient,
        sandbox_id: str,
        container_id: str,
        socket_path: Path,
        step_timeout_s: float,
    ) -> None:
        self.id = sandbox_id
        self.container_id = container_id
        self.socket_path = socket_path
        self.step_timeout_s = step_timeout_s
        self._client = client
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._buffer = b""
        self._lost: str | None = None
        self.served = 0
        """How many trajectories have taken this sandbox (`trajflow.sandbox.pool` hands one out again up to its
        `reuse`)."""

    def reset(
        self, env_id: str, seed: int, env_kwargs: dict[str, Any] | None = None, timeout_s: float | None = None
    ) -> ResetReply:
        """Make `env_id` with `env_kwargs` and reset it with `seed` (within `timeout_s`, default the step timeout)."""
        payload = {"op": "reset", "env_id": env_id, "seed": seed, "env_kwargs": env_kwargs or {}}
        reply = self.request(payload, timeout_s)
        return ResetReply(observation=reply["observation"], info=reply["info"])

    def step(self, action: str, timeout_s: float | None = None) -> StepReply:
        """Send one action to the environment (within `timeout_s`, default the step timeout)."""
        reply = self.request({"op": "step", "action": action}, timeout_s)
        return StepReply(
            observation=reply["observation"],
            reward=reply["reward"],
            terminated=reply["terminated"],
            truncated=reply["truncated"],
            info=reply["info"],
        )

    def request(self, payload: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        """Send one raw runner request and return its `ok: true` answer (see `trajflow/envs/runner.py` for the ops)."""
        timeout = self.step_timeout_s if timeout_s is None else timeout_s
        op = str(payload.get("op"))
        with self._lock:
            if self._lost is not None:
                raise SandboxLost(self.id, self._lost)
            try:
                reply = self._roundtrip(json.dumps(payload).encode() + b"\n", timeout)
            except TimeoutError:
                self._kill(f"{op} timed out after {timeout:g}s")
                raise SandboxStepTimeout(self.id, op, timeout) from None
            except (OSError, EOFError, ValueError) as e:
                reason = f"{op} failed on the socket ({type(e).__name__}: {e}); {self._container_state()}"
                self._mark_lost(reason)
                raise SandboxLost(self.id, reason) from e
        if not reply.get("ok"):
            error = reply.get("error") or {}
            agent_kind = error.get("kind")  # an AgentError's (`trajflow/envs/runner.py`)
            raise EnvError(
                str(error.get("type", "EnvError")),
                str(error.get("message", reply)),
                agent_kind if isinstance(agent_kind, str) else None,
            )
        return reply

    def _roundtrip(self, line: bytes, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            try:
                sock.connect(str(self.socket_path))
            except OSError:
                sock.close()
                raise
            self._sock, self._buffer = sock, b""
        self._sock.settimeout(max(deadline - time.monotonic(), 1e-3))
        self._sock.sendall(line)
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            self._sock.settimeout(remaining)
            chunk = self._sock.recv(_RECV_BYTES)
            if not chunk:
                raise EOFError("the runner closed the connection")
            self._buffer += chunk
        answer, _, self._buffer = self._buffer.partition(b"\n")
        reply: dict[str, Any] = json.loads(answer)
        return reply

    def _container_state(self) -> str:
        try:
            state = self._client.api.inspect_container(self.container_id)["State"]
        except docker.errors.NotFound:
            return "the container is gone"
        return f"container status {state.get('Status')}, exit code {state.get('ExitCode')}"

    def _mark_lost(self, reason: str) -> None:
        self._lost = reason
        self.disconnect()

    def _kill(self, reason: str) -> None:
        self._mark_lost(reason)
        try:
            self._client.api.kill(self.container_id)
        except docker.errors.APIError:
            pass  # already dead or removed: exactly the state we want

    def disconnect(self) -> None:
        """Close the socket connection (the container keeps running)."""
        if self._sock is not None:
            self._sock.close()
            self._sock, self._buffer = None, b""

    @property
    def lost_reason(self) -> str | None:
        """Why this sandbox is lost, or None while it is usable."""
        return self._lost


def _ping(socket_path: Path, timeout_s: float) -> bool:
    """One readiness probe: True when the runner at `socket_path` answers ping within the timeout."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(max(timeout_s, 0.05))
        try:
            sock.connect(str(socket_path))
            sock.sendall(b'{"op": "ping"}\n')
            answer = sock.makefile("rb").readline()
        except OSError:
            return False  # bound but not yet listening, or gone: the caller checks the container
    try:
        return bool(json.loads(answer).get("ok"))
    except ValueError:
        return False


@dataclass(frozen=True)
class SandboxLimits:
    """What a sandbox may use. Tmpfs sizes count against `mem_limit` (tmpfs pages are the container's memory)."""

    network_disabled: bool = True
    mem_limit: str = "1g"
    cpus: float = 1.0
    pids_limit: int = 256
    tmp_size: str = "64m"
    work_size: str = "256m"
    read_only_root: bool = True

    def container_options(self) -> dict[str, Any]:
        """The hardening part of `docker run`'s keyword arguments."""
        owner = f"uid={SANDBOX_UID},gid={SANDBOX_UID}"
        return {
            "network_mode": "none" if self.network_disabled else None,
            "mem_limit": self.mem_limit,
            "memswap_limit": self.mem_limit,  # no swap: past the limit the kernel's OOM killer acts
            "nano_cpus": int(self.cpus * 1e9),
            "pids_limit": self.pids_limit,
            "user": f"{SANDBOX_UID}:{SANDBOX_UID}",
            "read_only": self.read_only_root,
            "tmpfs": {
                "/tmp": f"rw,nosuid,nodev,size={self.tmp_size},mode=1777",
                WORK_DIR: f"rw,nosuid,nodev,size={self.work_size},mode=0755,{owner}",
            },
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
        }


class SandboxManager:
    """Starts and tracks the sandboxes of one owner (an env worker) on the local Docker engine."""

    def __init__(
        self,
        client: docker.DockerClient,
        image: str,
        runtime_dir: Path,
        owner_id: str,
        *,
        limits: SandboxLimits | None = None,
        start_timeout_s: float = 30,
        step_timeout_s: float = 60,
        host_name: str = "",
        owner_container: labels.OwnerContainer | None = None,
    ) -> None:
        self.client = client
        self.image = image
        self.runtime_dir = Path(runtime_dir)
        self.owner_id = owner_id
        self.host_name = host_name
        """The env worker's host (`TRAJFLOW_HOST_NAME`), labelled on each sandbox (see `trajflow.sandbox.labels`)."""
        self.owner_container = owner_container
        """The container this worker runs in on the same engine, if any (`trajflow.sandbox.reaper.own_container`),
        labelled so a reaper in another container can tell when this worker is gone."""
        self.limits = limits or SandboxLimits()
        self.start_timeout_s = start_timeout_s
        self.step_timeout_s = step_timeout_s
        self._lock = threading.Lock()
        self._sandboxes: dict[str, Sandbox] = {}
        self.leases = LeaseBook()
        """Who holds each sandbox and since when it is idle (`trajflow.sandbox.leases`); renewed by the env
        activities, read by the env worker's sweep."""

    def start(self, env_hint: str = "", image: str | None = None) -> Sandbox:
        """Start a container from `image` (default: the manager's) and return it once its runner answers
        `ping`. `env_hint` names the env it will host, so the runner imports only what that env needs (a
        non-`rg:` env skips reasoning_gym; a shell task imports no GEM at all)."""
        image = image or self.image
        sandbox_id = uuid.uuid4().hex[:12]
        host_dir = self._make_host_dir(sandbox_id)
        try:
            container = self.client.containers.run(
                image,
                detach=True,
                name=f"trajflow-sb-{sandbox_id}",
                labels=labels.owner_labels(self.owner_id, sandbox_id, self.host_name, self.owner_container),
                volumes={str(host_dir): {"bind": RUNNER_SOCKET_DIR, "mode": "rw"}},
                environment={"TRAJFLOW_ENV_HINT": env_hint} if env_hint else None,
                working_dir=WORK_DIR,
                **self.limits.container_options(),
            )
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            # RequestException: the engine itself is unreachable (daemon stopped, socket gone)
            shutil.rmtree(host_dir, ignore_errors=True)
            raise SandboxStartError(f"cannot start a container from {image}: {type(e).__name__}: {e}") from e
        assert container.id is not None  # docker's stubs allow a model without an id; a created container has one
        sandbox = Sandbox(self.client, sandbox_id, container.id, host_dir / SOCKET_NAME, self.step_timeout_s)
        with self._lock:
            self._sandboxes[sandbox_id] = sandbox
        self.leases.add(sandbox_id)
        try:
            self._wait_ready(sandbox)
        except BaseException:
            self.close(sandbox_id)
            raise
        return sandbox

    def _make_host_dir(self, sandbox_id: str) -> Path:
        host_dir = self.runtime_dir / sandbox_id
        if len(str(host_dir / SOCKET_NAME)) > MAX_SOCKET_PATH:
            raise SandboxStartError(f"runtime_dir {self.runtime_dir} is too long for a Unix socket path")
        host_dir.mkdir(parents=True)
        if os.geteuid() == 0:
            os.chown(host_dir, SANDBOX_UID, SANDBOX_UID)
            host_dir.chmod(0o700)
        else:
            host_dir.chmod(0o777)  # without root we cannot hand it to the container user any other way
        return host_dir

    def _wait_ready(self, sandbox: Sandbox) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        delay = 0.005
        while True:
            if sandbox.socket_path.exists() and _ping(sandbox.socket_path, deadline - time.monotonic()):
                return
            state = self.client.api.inspect_container(sandbox.container_id)["State"]
            if not state.get("Running"):
                logs = self.client.api.logs(sandbox.container_id, tail=20).decode(errors="replace")
                raise SandboxStartError(
                    f"sandbox {sandbox.id} exited (code {state.get('ExitCode')}) before it was ready:\n{logs}"
                )
            if time.monotonic() + delay > deadline:
                raise SandboxStartError(f"sandbox {sandbox.id} not ready within {self.start_timeout_s:g}s")
            time.sleep(delay)  # bounded backoff between readiness probes
            delay = min(delay * 2, 0.1)

    def get(self, sandbox_id: str) -> Sandbox:
        """The live sandbox `sandbox_id`; SandboxLost if it is unknown here or its container is not running."""
        with self._lock:
            sandbox = self._sandboxes.get(sandbox_id)
        if sandbox is None:
            raise SandboxLost(sandbox_id, f"unknown to this manager (owner {self.owner_id})")
        if sandbox.lost_reason is not None:
            raise SandboxLost(sandbox_id, sandbox.lost_reason)
        try:
            running = self.client.api.inspect_container(sandbox.container_id)["State"].get("Running")
        except docker.errors.NotFound:
            running = False
        if not running:
            raise SandboxLost(sandbox_id, "its container is not running")
        return sandbox

    def close(self, sandbox_id: str) -> None:
        """Remove the sandbox's container and directory; closing an unknown or closed sandbox does nothing."""
        with self._lock:
            sandbox = self._sandboxes.pop(sandbox_id, None)
        self.leases.drop(sandbox_id)
        if sandbox is not None:
            sandbox.disconnect()
        try:
            self.client.api.remove_container(f"trajflow-sb-{sandbox_id}", force=True)
        except docker.errors.NotFound:
            pass  # already gone
        except docker.errors.APIError as e:
            if e.status_code != 409:  # 409: removal already in progress elsewhere
                raise
        shutil.rmtree(self.runtime_dir / sandbox_id, ignore_errors=True)

    def expire(self, sandbox_id: str, idle_over_s: float) -> bool:
        """Close the sandbox if it is still idle past `idle_over_s` (the sweep's decision, re-checked atomically
        against a use that began meanwhile); True when it was closed."""
        if not self.leases.take_idle(sandbox_id, idle_over_s):
            return False
        self.close(sandbox_id)
        return True

    def close_all(self) -> None:
        """Close every sandbox this manager started."""
        with self._lock:
            ids = list(self._sandboxes)
        for sandbox_id in ids:
            self.close(sandbox_id)

    def sandbox_ids(self) -> list[str]:
        with self._lock:
            return list(self._sandboxes)
