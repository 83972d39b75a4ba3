"""Records kept in the object store (the data plane): token-level context and whole trajectories.

These never enter Temporal history; history holds their URIs. `TrajectoryRecord` is what a trainer will load.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from contracts.trajectory import (
    JsonScalar,
    TrajectoryRequest,
    TrajectoryStatus,
    TurnSummary,
)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str
    content: str


class TurnContext(BaseModel):
    """Everything the policy saw and produced so far in one trajectory, token by token.

    `token_ids`, `logprobs` and `loss_mask` are aligned: prompt and observation tokens have mask 0 and
    logprob 0.0; generated tokens have mask 1 and the behaviour policy's logprob. `turn_versions[i]` is the
    policy version that generated turn i; `turn_spans[i]` is its [start, end) in `token_ids`.
    """

    model_config = ConfigDict(extra="forbid")

    messages: list[ChatMessage] = Field(default_factory=list)
    token_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    turn_versions: list[int] = Field(default_factory=list)
    turn_spans: list[tuple[int, int]] = Field(default_factory=list)
    model: str = ""


class TrajectoryRecord(BaseModel):
    """A finished trajectory as written to the store by `trajectory.save`."""

    model_config = ConfigDict(extra="forbid")

    workflow_id: str
    request: TrajectoryRequest
    status: TrajectoryStatus
    reward: float | None
    reward_details: dict[str, JsonScalar] = Field(default_factory=dict)
    first_observation: str
    turns: list[TurnSummary]
    context: TurnContext | None
    env_recoveries: int
    error: str | None = None
    timings: dict[str, float] = Field(default_factory=dict)
    extra: dict[str, Any] = Field(default_factory=dict)
