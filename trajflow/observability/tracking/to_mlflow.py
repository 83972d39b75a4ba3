"""MLflow: a run per training run in an experiment, the config as flattened params, metrics by step. The tracking
URI defaults to a SQLite database in the run directory (`mlflow ui --backend-store-uri sqlite:///RUN_DIR/mlflow.db`;
MLflow keeps its file store in maintenance mode and refuses it by default)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trajflow.contracts.tracking import MlflowConfig
from trajflow.observability.tracking.base import missing

MAX_PARAM_CHARS = 500
"""MLflow limits a param's value; longer ones (a task's prompt) are cut."""


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """A nested config as `a.b.c` params (lists by index); empty sections vanish."""
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, list) and value:
        pairs = list(enumerate(value))
    else:
        return {prefix.rstrip("."): str(value)[:MAX_PARAM_CHARS]}
    out: dict[str, str] = {}
    for key, item in pairs:
        out.update(flatten(item, f"{prefix}{key}."))
    return out


class MlflowTracker:
    def __init__(self, config: MlflowConfig, run_dir: Path, run_id: str) -> None:
        try:
            import mlflow
        except ImportError:
            raise missing("mlflow-skinny", "mlflow") from None
        self.mlflow = mlflow
        run_dir.mkdir(parents=True, exist_ok=True)
        uri = config.tracking_uri or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(config.experiment)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(config.experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=run_id).info.run_id

    def config(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in flatten(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in values.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
