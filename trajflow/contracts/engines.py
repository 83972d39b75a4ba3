"""What a decode pool's engine says of itself (`llm.describe`), the finish reason of a turn that had no room, and
the published weights an engine loads (named here so that the policy store, `trajflow.infra.policies`, and the
engines, `trajflow.rl.engines`, share them without importing each other)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trajflow.contracts.base import Contract

CONTEXT_FULL = "context_full"
"""`GenerateResult.finish_reason` of a turn whose prompt already fills the context budget: nothing was generated,
and the episode ends there (completed, truncated)."""


class EngineInfo(Contract):
    """A decode worker's engine (`llm.describe`): what a training run checks of each of its decode pools before it
    starts (`trajflow.workflows.preflight`)."""

    name: str
    follows_training: bool
    """False for a frozen policy (`trajflow.rl.engines.base.Engine.follows_training`)."""
    version: int
    """The policy version loaded now (a frozen engine's, for ever)."""
    max_positions: int | None
    """The engine's positions (`Engine.max_positions`); None when unknown."""
    worker_id: str
    pool: str


def no_room(prompt_tokens: int, budget: int | None) -> str:
    """The error of an episode whose first prompt already fills the context budget (failed: nothing to score)."""
    limit = f"max_context_tokens = {budget}" if budget else "the model's positions"
    return (
        f"the first prompt ({prompt_tokens} tokens) leaves no room in the context budget ({limit}): nothing to "
        "score. Shorten the system prompt or the task's first observation, or raise max_context_tokens"
    )


@dataclass(frozen=True)
class PolicyWeights:
    """Published weights of one policy (a training run) at one version, downloaded to a local directory."""

    policy: str
    version: int
    path: Path
    """A Hugging Face checkpoint directory (config + safetensors) loadable by `from_pretrained`."""
