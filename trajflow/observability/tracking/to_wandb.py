"""Weights & Biases: offline by default (the run is written under the run directory; `wandb sync` uploads it).
Every chart's x axis is the policy version (`version`), not W&B's own step counter, so a step that arrives late (seen
only in the run's final history) still lands where it belongs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trajflow.contracts.tracking import WandbConfig
from trajflow.observability.tracking.base import missing


class WandbTracker:
    def __init__(self, config: WandbConfig, run_dir: Path, run_id: str) -> None:
        try:
            import wandb
        except ImportError:
            raise missing("wandb", "wandb") from None
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=config.project,
            entity=config.entity,
            mode=config.mode,
            dir=str(run_dir),
            name=run_id,
            id=run_id,
            resume="allow",
        )
        self.run.define_metric("version")
        self.run.define_metric("*", step_metric="version")

    def config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log({"version": step, **values})

    def close(self) -> None:
        self.run.finish()
