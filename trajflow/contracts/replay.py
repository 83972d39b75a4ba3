"""Input and result of `ReplayEnvWorkflow`: a recorded trajectory's actions re-driven into a fresh sandbox, no LLM.

Small by construction: one turn's action and observation text per step, as `TurnSummary` keeps them.
"""

from __future__ import annotations

from pydantic import Field

from trajflow.contracts.base import Contract
from trajflow.contracts.trajectory import JsonScalar


class EnvReplayInput(Contract):
    """What to re-drive: the env, its seed and kwargs, the recorded actions, and the env pool that hosts it."""

    env_id: str
    seed: int = 0
    env_kwargs: dict[str, JsonScalar] = Field(default_factory=dict)
    env_package: str = ""
    """A `py:` env's package URI."""
    actions: list[str] = Field(default_factory=list)
    env_pool: str = "default"
    replay_of: str = ""
    """The trajectory whose actions these are (shown as the TrajflowReplayOf search attribute)."""


class EnvReplayStep(Contract):
    action: str
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, JsonScalar] = Field(default_factory=dict)


class EnvReplayResult(Contract):
    """What the fresh sandbox answered, step by step; `error` says where it stopped when it did not finish."""

    first_observation: str = ""
    steps: list[EnvReplayStep] = Field(default_factory=list)
    error: str | None = None
    sandbox_id: str = ""
    worker_id: str = ""
    image: str = ""
    done: bool = False
    """True when the workflow has ended (the `progress` query answers partial results before that)."""
