"""What `trajflow train` writes when a run ends: the held-out evaluations and the run's `summary.json`.

Written with `model_dump_json` and read back with `model_validate_json` (scripts/plot_runs.py, tests); the JSON
keys are the ones the README lists. Not a Temporal contract (nothing here crosses a workflow boundary), but kept
beside them so every file trajflow writes has one schema.
"""

from __future__ import annotations

from pydantic import Field

from contracts.base import Contract
from contracts.training import LossKind, TrainingCounters


class EvalResult(Contract):
    """Greedy rollouts of the held-out seeds with one policy version."""

    version: int
    """The policy version evaluated (0: the initial model)."""
    episodes: int
    scored: int
    """Episodes that completed and were scored."""
    not_completed: int
    """Episodes that failed or were infra-failed: counted as losses in the success rate."""
    success_rate: float
    """Episodes whose last env reward was at least 1 (a win), over all episodes."""
    mean_reward: float
    """Mean reward of the scored episodes (0.0 when none was)."""
    seconds: float


class RunSummary(Contract):
    """A training run as `summary.json` keeps it."""

    run_id: str
    eval_before: EvalResult | None
    """None when the run was not evaluated (`--no-eval`, or `[train.eval] episodes = 0`)."""
    eval_after: EvalResult | None
    steps: int
    """Optimizer steps taken: the final policy version."""
    trajectories_trained: int
    trajectories_dropped_stale: int
    wall_seconds: float
    trajectories_per_s: float
    """Completed trajectories per second of wall time."""
    alpha: int
    sync: bool
    batch_size: int
    group_size: int
    loss: LossKind
    counters: TrainingCounters
    staleness_histogram: dict[str, int] = Field(default_factory=dict)
    """v_train - version -> trajectories trained at that staleness."""
    reward_by_step: list[float] = Field(default_factory=list)
    """Mean training reward of each step's batch."""
    time_by_step: list[float] = Field(default_factory=list)
    """Seconds since the run started at which each step ended."""
    last_metrics: dict[str, float] = Field(default_factory=dict)
    """The last step's trainer metrics (loss, clip fraction, rollout/trainer KL, ...)."""
