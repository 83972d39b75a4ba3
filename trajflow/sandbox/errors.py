"""The errors of the sandbox layer, split by who is at fault.

Infra (retry with a fresh sandbox, never score): `SandboxLost`, `SandboxStepTimeout` (a kind of lost),
`SandboxStartError`, `ImageBuildError`. The environment itself (not infra, retrying the same request will not help):
`EnvError` (an agent program's failure too), `AgentDiverged`. Limits: plain exceptions with a message and a few
fields; mapping them to Temporal errors is the activities' job.
"""

from __future__ import annotations


class SandboxError(Exception):
    """Base of every sandbox error."""


class SandboxLost(SandboxError):
    """The sandbox is gone: its container died, or its socket broke. Infra: retry on a fresh sandbox."""

    def __init__(self, sandbox_id: str, reason: str) -> None:
        super().__init__(f"sandbox {sandbox_id} lost: {reason}")
        self.sandbox_id = sandbox_id
        self.reason = reason


class SandboxStepTimeout(SandboxLost):
    """A request outlived its timeout; the container has been killed, so the sandbox is lost too."""

    def __init__(self, sandbox_id: str, op: str, timeout_s: float) -> None:
        super().__init__(sandbox_id, f"{op} exceeded its {timeout_s:g}s timeout; the container was killed")
        self.op = op
        self.timeout_s = timeout_s


class SandboxStartError(SandboxError):
    """A container could not be started, or its runner never answered within the start timeout."""


class ImageBuildError(SandboxError):
    """The image an env needs could not be built (or found). Infra: retried; it never scores an episode."""


class EnvError(SandboxError):
    """The environment rejected the request (unknown env id, bad request, exception in env code). Not infra.

    `kind` is the runner's error type: "EnvError", "UnknownEnv", "BadRequest" or "AgentError" (an `agent:` env's
    program failed; `agent_kind` then says how: crashed, hung, malformed_request or bad_result).
    """

    def __init__(self, kind: str, message: str, agent_kind: str | None = None) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.agent_kind = agent_kind


class AgentDiverged(SandboxError):
    """An agent program restored by replay asked something else than its record says (`trajflow.sandbox.agents`):
    not infra, and a fresh sandbox would not help."""
