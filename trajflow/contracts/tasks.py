"""A task: what to roll out (env, prompt, sampling, reward) and which pool serves each of its stages."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from trajflow.contracts.base import Contract
from trajflow.contracts.limits import ContextBudget, EnvId, EnvKwargs, EnvPackage, Name, SystemPrompt
from trajflow.contracts.reward_models import RewardModelConfig
from trajflow.contracts.trajectory import (
    DEFAULT_ENV_ID,
    DEFAULT_SYSTEM_PROMPT,
    SamplingParams,
    StagePools,
    TrajectoryRequest,
)


class TaskConfig(Contract):
    name: Name = "default"
    """A short name for the task, used in summaries."""
    env_id: EnvId = DEFAULT_ENV_ID
    env_kwargs: EnvKwargs = Field(default_factory=dict)
    env_path: str = ""
    """A `py:MODULE:CLASS` env's or `agent:MODULE:FUNCTION`/`agent-cmd:FILE` program's source directory (relative to
    the config file; made absolute when it is loaded): MODULE (or FILE), its package and an optional requirements.txt
    (`trajflow.sandbox.user.source`); a `data:NAME` task's file."""
    env_package: EnvPackage = ""
    """Set when the run is submitted: the object-store URI of the env's packed source
    (`trajflow.sandbox.user.packages`)."""
    tools: bool = False
    """An `agent:` task whose program passes tools (`tools` in its chat requests): the run is refused at submission
    unless the model's chat template renders tools. A request with tools on a task without it is answered where the
    template renders tools, and fails its trajectory where it does not."""
    max_turns: Annotated[int, Field(ge=1, le=200)] = 8
    max_context_tokens: ContextBudget = None
    """The task's context budget: prompt plus new tokens of a turn within it and the model's positions (None: the
    model's positions). An episode that reaches it ends as completed (truncated) and is scored by its reward rule."""
    system_prompt: SystemPrompt = DEFAULT_SYSTEM_PROMPT
    sampling: SamplingParams = SamplingParams()
    reward_fn: Name = "env_outcome"
    """A reward function of the reward service (`trajflow.rewards.registry`), or `model:NAME` for the reward model
    declared as `[reward_models.NAME]` in the run config."""
    reward_model: RewardModelConfig | None = None
    """Filled in by the run config from `[reward_models.NAME]` when `reward_fn = "model:NAME"`; not written by hand."""
    pools: StagePools = StagePools()
    """Which pool serves each stage of this task (hardware affinity)."""
    weight: Annotated[float, Field(gt=0.0)] = 1.0
    """Relative share of this task's trajectories in a mixed run."""

    def request(self, seed: int, **overrides: object) -> TrajectoryRequest:
        """A trajectory request for this task with the given seed."""
        fields: dict[str, object] = {
            "env_id": self.env_id,
            "env_kwargs": dict(self.env_kwargs),
            "env_package": self.env_package,
            "seed": seed,
            "max_turns": self.max_turns,
            "max_context_tokens": self.max_context_tokens,
            "system_prompt": self.system_prompt,
            "sampling": self.sampling,
            "reward_fn": self.reward_fn,
            "reward_model": self.reward_model,
            "pools": self.pools,
            "task": self.name,
        }
        fields.update(overrides)
        return TrajectoryRequest.model_validate(fields)
