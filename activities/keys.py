"""Where activities put a trajectory's data in the object store."""

from __future__ import annotations

import re


def store_key(trajectory_id: str, name: str) -> str:
    """`trajectories/<workflow id>/<run id>/<name>`, with characters outside [A-Za-z0-9._-/] replaced."""
    safe = re.sub(r"[^A-Za-z0-9._/-]", "_", trajectory_id).replace("..", "_").strip("/")
    return f"trajectories/{safe}/{name}"


def context_turn_key(trajectory_id: str, turn: int, attempt: int = 1) -> str:
    """Where turn `turn` of a trajectory stores what it added to the token context (`contracts.records.TurnDelta`).
    A retried attempt writes its own key, so an earlier attempt that finishes late never overwrites the delta the
    workflow went on with."""
    suffix = "" if attempt <= 1 else f"-attempt{attempt}"
    return store_key(trajectory_id, f"context-turn{turn:03d}{suffix}.json")
