"""TensorBoard event files through tensorboardX (no TensorFlow, no torch): scalars by name, the config as text."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class TensorBoardTracker:
    def __init__(self, log_dir: Path) -> None:
        from tensorboardX import SummaryWriter

        self.log_dir = log_dir
        self.writer = SummaryWriter(logdir=str(log_dir), flush_secs=10)

    def config(self, config: Mapping[str, Any]) -> None:
        text = json.dumps(config, indent=2, default=str)
        self.writer.add_text("config", "    " + text.replace("\n", "\n    "), 0)  # indented: shown as code

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
