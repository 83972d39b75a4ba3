"""The `trajflow` command (typer). Thin: parses arguments, imports what a command needs inside it, prints.

`app` is assembled here from the command modules: `stack` (setup, reward-image, up, down, status, worker),
`runs` (rollout, train, chaos, demo), `inspection` (images, trajectories, replay), `configs` (the shipped run configs)
`benchmarks` (bench) and `analysis` (analyze).
`--help` must stay instant, so nothing heavy (torch, transformers, docker, temporalio) is imported at module
level in any of them.
"""

from __future__ import annotations

# Each module registers its commands on `app` when imported; the order here is the order of `--help`.
from trajflow.cli import (
    analysis,  # noqa: F401
    benchmarks,  # noqa: F401
    configs,  # noqa: F401
    inspection,  # noqa: F401
    runs,  # noqa: F401
    stack,  # noqa: F401
)
from trajflow.cli.common import app

__all__ = ["app"]

if __name__ == "__main__":
    app()
