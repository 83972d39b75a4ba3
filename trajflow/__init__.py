"""trajflow: agentic RL where every trajectory is a durable Temporal workflow.

The public API, for programs that start and follow trajectories and training runs on a running stack
(`trajflow up`, or workers of your own on a Temporal cluster):

    import asyncio
    from trajflow import TrajectoryRequest, load_trajectory, run_trajectory

    result = asyncio.run(run_trajectory(TrajectoryRequest(env_id="game:GuessTheNumber-v0-easy", seed=3)))
    record = load_trajectory(result.trajectory_uri)

Every name is imported on first use, so `import trajflow.contracts` (what the workflows and the reward service
import) loads nothing of the client, Temporal's client or the store.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trajflow.client import (
        attach_training,
        load_trajectory,
        run_trajectory,
        start_branches,
        start_training,
        start_trajectory,
        stop_training,
        training_progress,
    )
    from trajflow.contracts.config import RunConfig, shipped_configs
    from trajflow.contracts.config import load_run_config as load_config
    from trajflow.contracts.records import TrajectoryRecord
    from trajflow.contracts.training import TrainingProgress, TrainingResult, TrainingRunConfig
    from trajflow.contracts.trajectory import SamplingParams, TrajectoryRequest, TrajectoryResult
    from trajflow.infra.settings import Settings, load_settings
    from trajflow.infra.temporal import connect

_EXPORTS: dict[str, tuple[str, str]] = {
    # models: what a trajectory is asked to do and what it gives back; a run config and a training run's state
    "TrajectoryRequest": ("trajflow.contracts.trajectory", "TrajectoryRequest"),
    "SamplingParams": ("trajflow.contracts.trajectory", "SamplingParams"),
    "TrajectoryResult": ("trajflow.contracts.trajectory", "TrajectoryResult"),
    "TrajectoryRecord": ("trajflow.contracts.records", "TrajectoryRecord"),
    "RunConfig": ("trajflow.contracts.config", "RunConfig"),
    "TrainingRunConfig": ("trajflow.contracts.training", "TrainingRunConfig"),
    "TrainingProgress": ("trajflow.contracts.training", "TrainingProgress"),
    "TrainingResult": ("trajflow.contracts.training", "TrainingResult"),
    # configs: a TOML file or a shipped config's name
    "load_config": ("trajflow.contracts.config", "load_run_config"),
    "shipped_configs": ("trajflow.contracts.config", "shipped_configs"),
    # connecting: the TRAJFLOW_* settings and a Temporal client with trajflow's data converter
    "Settings": ("trajflow.infra.settings", "Settings"),
    "load_settings": ("trajflow.infra.settings", "load_settings"),
    "connect": ("trajflow.infra.temporal", "connect"),
    # trajectories and training runs
    "start_trajectory": ("trajflow.client", "start_trajectory"),
    "run_trajectory": ("trajflow.client", "run_trajectory"),
    "load_trajectory": ("trajflow.client", "load_trajectory"),
    "start_branches": ("trajflow.client", "start_branches"),
    "start_training": ("trajflow.client", "start_training"),
    "attach_training": ("trajflow.client", "attach_training"),
    "stop_training": ("trajflow.client", "stop_training"),
    "training_progress": ("trajflow.client", "training_progress"),
}

__all__ = [
    "TrajectoryRequest",
    "SamplingParams",
    "TrajectoryResult",
    "TrajectoryRecord",
    "RunConfig",
    "TrainingRunConfig",
    "TrainingProgress",
    "TrainingResult",
    "load_config",
    "shipped_configs",
    "Settings",
    "load_settings",
    "connect",
    "start_trajectory",
    "run_trajectory",
    "load_trajectory",
    "start_branches",
    "start_training",
    "attach_training",
    "stop_training",
    "training_progress",
]


def __getattr__(name: str) -> Any:
    """Import a public name on first use (PEP 562) and keep it."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'trajflow' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
