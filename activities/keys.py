"""Where activities put a trajectory's data in the object store."""

from __future__ import annotations

import re


def store_key(trajectory_id: str, name: str) -> str:
    """`trajectories/<workflow id>/<run id>/<name>`, with characters outside [A-Za-z0-9._-/] replaced."""
    safe = re.sub(r"[^A-Za-z0-9._/-]", "_", trajectory_id).replace("..", "_").strip("/")
    return f"trajectories/{safe}/{name}"
