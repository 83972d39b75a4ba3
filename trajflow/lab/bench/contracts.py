"""Inputs and results of the benchmark-only workflows (`trajflow.lab.bench.batch_rollout`): what crosses Temporal."""

from __future__ import annotations

from pydantic import Field, model_validator

from trajflow.contracts.base import Contract
from trajflow.contracts.trajectory import TrajectoryRequest

BATCH_ROLLOUT_WORKFLOW = "BatchRolloutWorkflow"


class BatchRolloutInput(Contract):
    """B episodes to roll out in lockstep (batch-level env interaction)."""

    requests: list[TrajectoryRequest] = Field(min_length=1)
    """One request per episode (env, seed, pools, sampling, turn limit)."""
    episode_ids: list[str] = Field(default_factory=list)
    """The id each episode gives its env (what a TrajectoryWorkflow gives as its workflow id); empty: derived
    from this workflow's id. Equal ids make a synthetic env replay the same episode in both modes."""

    @model_validator(mode="after")
    def _ids_match(self) -> BatchRolloutInput:
        if self.episode_ids and len(self.episode_ids) != len(self.requests):
            raise ValueError(f"{len(self.episode_ids)} episode ids for {len(self.requests)} requests")
        return self


class BatchRolloutResult(Contract):
    episodes: int
    completed: int
    """Episodes scored (ended by their env or their turn limit)."""
    rounds: int
    """Lockstep rounds (one LLM barrier and one env barrier each): the longest episode's turns."""
    turns: list[int]
    rewards: list[float | None]
    seconds: float
    """Workflow time from start to the last save."""
