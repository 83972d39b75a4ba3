"""Input and result of the reward activity (`activities/reward.py`), and the reward service's request body."""

from __future__ import annotations

from pydantic import Field

from trajflow.contracts.base import Contract, FiniteFloat, JsonScalar
from trajflow.contracts.reward_models import RewardModelConfig


class ScoreRequest(Contract):
    """The body of the reward service's `POST /score` (HTTP, not Temporal, but kept beside its siblings)."""

    reward_fn: str = "env_outcome"
    env_id: str
    seed: int = 0
    actions: list[str] = Field(default_factory=list)
    env_rewards: list[float] = Field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    final_info: dict[str, JsonScalar] = Field(default_factory=dict)
    reward_model: RewardModelConfig | None = None
    """The reward model of `reward_fn = "model:NAME"`; None for rule rewards."""
    observations: list[str] = Field(default_factory=list)
    """The env's observations in order, the first one the task's prompt (after reset), then one after each action;
    sent only with a reward model."""


class ScoreResult(Contract):
    reward: FiniteFloat
    """Finite: a NaN or infinite reward is a broken reward service, never a sample to train on."""
    reward_fn: str
    details: dict[str, JsonScalar] = Field(default_factory=dict)


class ScoreInput(Contract):
    request: ScoreRequest
