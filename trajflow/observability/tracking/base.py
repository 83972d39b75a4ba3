"""The logger interface (`Tracker`), what a training step and an evaluation log (`step_scalars`,
`eval_scalars`), and the trackers a run config names (`open_trackers`), fanned out as one.

Names are grouped by a prefix (`rollout/`, `train/`, `eval/`, `eval_curve/`), the way TensorBoard and W&B group
charts; the x axis is the policy version a step produced (an evaluation logs at the version it evaluated).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from trajflow.contracts.runs import CurvePoint, EvalResult
from trajflow.contracts.tracking import TrackingConfig
from trajflow.contracts.training import StepRecord


class Tracker(Protocol):
    def config(self, config: Mapping[str, Any]) -> None:
        """The run's resolved config, once at the start."""

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Values at `step` (a policy version)."""

    def close(self) -> None: ...


def step_scalars(record: StepRecord, previous: StepRecord | None) -> dict[str, float]:
    """What one training step logs: the batch's reward and staleness, the trainer's own metrics (loss, KL, clip
    fraction, entropy, ... under `train/`), its seconds, and the throughput since the step before."""
    lags = record.staleness  # lag -> samples
    values = {
        "rollout/reward_mean": record.reward_mean,
        "rollout/trajectories": float(record.trajectories),
        "rollout/staleness_mean": sum(lag * n for lag, n in lags.items()) / (sum(lags.values()) or 1),
        "rollout/staleness_max": float(max(lags, default=0)),
        "rollout/stale_dropped_total": float(record.stale_dropped_total),
        "train/step_seconds": record.train_s,
        "time/minutes": record.time_s / 60,
    }
    since = record.time_s - (previous.time_s if previous is not None else 0.0)
    if since > 0:
        values["time/trajectories_per_s"] = record.trajectories / since
    values.update({f"train/{name}": float(v) for name, v in record.metrics.items()})
    return values


def eval_scalars(result: EvalResult) -> dict[str, float]:
    values = {"eval/success_rate": result.success_rate, "eval/mean_reward": result.mean_reward}
    values.update({f"eval/pass_at_{k}": v for k, v in result.pass_at_k.items()})  # MLflow refuses "@"
    return values


def curve_scalars(point: CurvePoint) -> dict[str, float]:
    """A point of the held-out success by step (`[train.eval] every`): under its own prefix, since its seeds are the
    first `during_episodes` of the held-out ones, not all of them as `eval/`'s before and after are."""
    return {"eval_curve/success_rate": point.rate, "eval_curve/mean_reward": point.mean_reward}


class Fanout:
    """Every tracker of a run as one; a tracker that fails is closed and dropped with a warning, never the run."""

    def __init__(self, trackers: list[tuple[str, Tracker]], warn) -> None:
        self.trackers = trackers
        self.warn = warn

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.trackers]

    def _each(self, call) -> None:
        for name, tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as e:
                self.warn(f"tracking: {name} failed ({type(e).__name__}: {e}); it logs nothing more")
                self.trackers.remove((name, tracker))

    def config(self, config: Mapping[str, Any]) -> None:
        self._each(lambda t: t.config(config))

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self._each(lambda t: t.scalars(step, values))

    def close(self) -> None:
        self._each(lambda t: t.close())


def open_trackers(config: TrackingConfig, run_dir: Path, run_id: str, warn) -> Fanout:
    """The trackers `config` names, each opened on `run_dir`. A backend whose package is missing raises a
    RuntimeError saying what to install, before the run starts."""
    trackers: list[tuple[str, Tracker]] = []
    if config.tensorboard:
        from trajflow.observability.tracking.to_tensorboard import TensorBoardTracker

        trackers.append(("tensorboard", TensorBoardTracker(run_dir / "tensorboard")))
    if config.wandb is not None:
        from trajflow.observability.tracking.to_wandb import WandbTracker

        trackers.append(("wandb", WandbTracker(config.wandb, run_dir, run_id)))
    if config.mlflow is not None:
        from trajflow.observability.tracking.to_mlflow import MlflowTracker

        trackers.append(("mlflow", MlflowTracker(config.mlflow, run_dir, run_id)))
    return Fanout(trackers, warn)


def missing(package: str, backend: str) -> RuntimeError:
    return RuntimeError(
        f"the run config's [tracking] names {backend}, but the `{package}` package is not installed: "
        f"`.venv/bin/pip install -e '.[tracking]'` installs it (pinned in pyproject.toml)"
    )
