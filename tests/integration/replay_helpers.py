"""Failure makers for the replay tests and the history recorder: a policy that kills its trajectory's sandbox
before chosen turns, and a sandbox manager whose container starts fail while it is `broken`."""

from __future__ import annotations

from typing import Any

from trajflow.contracts import names
from trajflow.sandbox.errors import SandboxStartError

GUESS = "I guess \\boxed{999}"  # valid format, out of range: the game goes on to its turn limit


class SandboxKillingEngine:
    """Wraps an engine; before its calls numbered in `kill_at` (0-based) it kills the container of the sandbox
    the trajectory (`handle`, set once started) is using, so that turn's env step fails with SandboxLost."""

    def __init__(self, inner: Any, manager: Any, docker_client: Any, kill_at: set[int]) -> None:
        self.inner = inner
        self.manager = manager
        self.docker = docker_client
        self.kill_at = set(kill_at)
        self.handle: Any = None
        self.calls = 0
        self.killed: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def generate(self, prompt_ids, params, policy=""):
        call, self.calls = self.calls, self.calls + 1
        if call in self.kill_at:
            assert self.handle is not None, "set .handle to the trajectory's handle before it reaches a kill"
            progress = await self.handle.query(names.QUERY_PROGRESS)
            container = self.manager.get(progress["sandbox"]).container_id
            self.docker.containers.get(container).kill()
            self.killed.append(progress["sandbox"])
        return await self.inner.generate(prompt_ids, params, policy)


class FlakyManager:
    """A SandboxManager whose `start` fails (an infra error: SandboxStartError) while `broken` is set."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.broken = True
        self.failed_starts = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def start(self, env_hint: str = "", image: str | None = None) -> Any:
        if self.broken:
            self.failed_starts += 1
            raise SandboxStartError("the Docker engine is gone (simulated)")
        return self.inner.start(env_hint, image)
