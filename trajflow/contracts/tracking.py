"""Where `trajflow train` logs a run's per-step metrics, evaluations and config (the `[tracking]` section):
TensorBoard event files in the run directory by default, and Weights & Biases or MLflow when named."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trajflow.contracts.base import Contract


class WandbConfig(Contract):
    project: str = Field(default="trajflow", min_length=1)
    entity: str | None = None
    mode: Literal["offline", "online"] = "offline"
    """`offline` writes the run under the run directory (`wandb sync` uploads it later); `online` needs a login."""


class MlflowConfig(Contract):
    tracking_uri: str | None = None
    """None: a SQLite database in the run directory (`mlflow.db`); else any MLflow tracking URI (a server, a
    database)."""
    experiment: str = Field(default="trajflow", min_length=1)


class TrackingConfig(Contract):
    tensorboard: bool = True
    """Event files under the run directory's `tensorboard/` (`tensorboard --logdir ~/.trajflow/runs`)."""
    wandb: WandbConfig | None = None
    mlflow: MlflowConfig | None = None
