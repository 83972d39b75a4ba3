"""Records kept in the object store (the data plane): token-level context and whole trajectories.

These never enter Temporal history; history holds their URIs. `TrajectoryRecord` is what a trainer will load.
A running trajectory's context is stored turn by turn as `TurnDelta`s (what each turn added, linked to the turn
before), so a turn writes O(its own tokens), never the whole context again; `trajectory.save` joins them into the
record's one `TurnContext`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from trajflow.contracts.base import ChatMessage, Contract
from trajflow.contracts.trajectory import (
    JsonScalar,
    TrajectoryRequest,
    TrajectoryStatus,
    TurnSummary,
)


class TurnContext(Contract):
    """Everything the policy saw and produced so far in one trajectory, token by token.

    `token_ids`, `logprobs` and `loss_mask` are aligned: prompt and observation tokens have mask 0 and
    logprob 0.0; generated tokens have mask 1 and the behaviour policy's logprob. `turn_versions[i]` is the
    policy version that generated turn i (the oldest, when an engine moved the turn to newer weights mid-way:
    `HFEngine`'s `interrupt_on_update`); `turn_spans[i]` is its [start, end) in `token_ids`.
    """

    messages: list[ChatMessage] = Field(default_factory=list)
    token_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    turn_versions: list[int] = Field(default_factory=list)
    turn_spans: list[tuple[int, int]] = Field(default_factory=list)
    model: str = ""


class TurnDelta(Contract):
    """What one turn added to a trajectory's `TurnContext`: the tail of each of its lists, and where it starts.

    `previous` is the store URI of the turn before's delta (None on the first turn), so the whole context is the
    chain of deltas from the first to this one, applied in order. `messages_before`, `tokens_before` and
    `turns_before` are the lengths the context had before this turn; `apply` checks them, so a delta is never
    joined onto a context it was not made from.
    """

    previous: str | None
    messages_before: int
    tokens_before: int
    turns_before: int
    messages: list[ChatMessage] = Field(default_factory=list)
    token_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    turn_versions: list[int] = Field(default_factory=list)
    turn_spans: list[tuple[int, int]] = Field(default_factory=list)
    model: str = ""

    @classmethod
    def between(cls, before: TurnContext, after: TurnContext, previous: str | None) -> TurnDelta:
        """The delta that turns `before` into `after` (which must extend it)."""
        m, n, k = len(before.messages), len(before.token_ids), len(before.turn_versions)
        if after.messages[:m] != before.messages or after.token_ids[:n] != before.token_ids:
            raise ValueError("the new context does not extend the old one: no delta between them")
        return cls(
            previous=previous,
            messages_before=m,
            tokens_before=n,
            turns_before=k,
            messages=after.messages[m:],
            token_ids=after.token_ids[n:],
            logprobs=after.logprobs[n:],
            loss_mask=after.loss_mask[n:],
            turn_versions=after.turn_versions[k:],
            turn_spans=after.turn_spans[k:],
            model=after.model,
        )

    def apply(self, ctx: TurnContext) -> TurnContext:
        """`ctx` with this delta appended (a new context; `ctx` is left as it was)."""
        have = (len(ctx.messages), len(ctx.token_ids), len(ctx.turn_versions))
        want = (self.messages_before, self.tokens_before, self.turns_before)
        if have != want:
            raise ValueError(
                f"a context delta made for (messages, tokens, turns) = {want} cannot extend a context of {have}"
            )
        return TurnContext(
            messages=[*ctx.messages, *self.messages],
            token_ids=[*ctx.token_ids, *self.token_ids],
            logprobs=[*ctx.logprobs, *self.logprobs],
            loss_mask=[*ctx.loss_mask, *self.loss_mask],
            turn_versions=[*ctx.turn_versions, *self.turn_versions],
            turn_spans=[*ctx.turn_spans, *self.turn_spans],
            model=self.model,
        )


class TrajectoryRecord(Contract):
    """A finished trajectory as written to the store by `trajectory.save`."""

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
    context_full: bool = False
    """The episode ended because its next prompt filled the context budget (`TrajectoryRequest.max_context_tokens`):
    completed and scored, truncated."""

    @model_validator(mode="before")
    @classmethod
    def _drop_old_extra(cls, data: Any) -> Any:
        # Records saved before the unused `extra` field was removed hold `"extra": {}`: still readable.
        if isinstance(data, dict) and data.get("extra") == {}:
            data = {k: v for k, v in data.items() if k != "extra"}
        return data
