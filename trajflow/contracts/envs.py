"""Inputs and results of the env activities (`activities/env.py`): a sandbox's handle, reset, step and close.

`trajflow.contracts.trajectory` re-exports them (workflows and older code import them from there).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from trajflow.contracts.base import Contract, JsonScalar


class SandboxHandle(Contract):
    """A live sandbox: which env worker holds it and the queue its steps must go to."""

    sandbox_id: str
    container_id: str
    host_queue: str
    worker_id: str
    image: str
    step_timeout_s: float = 60.0
    """The env worker kills a step's container after this long; the workflow's timeout is a little longer. An
    `agent:` env's is at least its `budget_s` plus a margin (the program may work that long between two calls)."""
    env_id: str = ""
    """The env the sandbox hosts, set at reset (empty in histories from before it was kept)."""


class EnvResetInput(Contract):
    trajectory_id: str
    env_id: str
    seed: int
    env_kwargs: dict[str, JsonScalar] = Field(default_factory=dict)
    env_package: str = ""
    """A `py:`, `agent:` or `data:` env's package URI (`TrajectoryRequest.env_package`)."""
    replay_actions: list[str] = Field(default_factory=list)
    """Actions to replay after reset, restoring a lost sandbox's state (environments are seeded and deterministic)."""
    expect_digests: list[str] = Field(default_factory=list)
    """The digests (`trajflow.contracts.agent.request_digest`) of the observations recorded after each of
    `replay_actions` (an `agent:` env's: the program's next request). When given (as many as `replay_actions`), the
    reset compares each replayed step's observation with it and fails non-retryably with `AgentNonDeterministic` at
    the first that differs; empty: no check."""

    @model_validator(mode="after")
    def _one_expectation_per_action(self) -> EnvResetInput:
        if self.expect_digests and len(self.expect_digests) != len(self.replay_actions):
            raise ValueError(
                f"expect_digests has {len(self.expect_digests)} digests for "
                f"{len(self.replay_actions)} replay_actions: give one per action, or none"
            )
        return self


class EnvResetResult(Contract):
    handle: SandboxHandle
    observation: str
    """The chat text of the current observation (after any replayed actions), formatted on our side."""
    replayed: int = 0
    done: bool = False
    """True when the replayed actions already ended the episode."""


class EnvStepInput(Contract):
    handle: SandboxHandle
    action: str


class EnvStepResult(Contract):
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, JsonScalar] = Field(default_factory=dict)


class EnvCloseInput(Contract):
    handle: SandboxHandle
