"""Watching child workflows a run inherited through continue-as-new (`training.watch_children`): its input and
result. Re-exported by `trajflow.contracts.training`."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from trajflow.contracts.trainer import NanSafeContract as _Model
from trajflow.contracts.trajectory import TrajectoryResult


class WatchChildrenInput(_Model):
    """Trajectories a training run inherited through continue-as-new (its watchers did not survive it)."""

    workflow_ids: list[str] = Field(min_length=1)
    poll_s: Annotated[float, Field(gt=0, le=60)] = 2.0
    """How often their status is read."""
    results: bool = True
    """Read a completed child's result (a trajectory's `TrajectoryResult`); False for children whose result is not
    wanted (a sharded run's shards)."""


class ChildOutcome(_Model):
    workflow_id: str
    status: str
    """The closed execution's status: COMPLETED, FAILED, TERMINATED, CANCELED, TIMED_OUT, or NOT_FOUND."""
    result: TrajectoryResult | None = None
    """A completed trajectory's result (its report may have been lost)."""


class WatchChildrenResult(_Model):
    closed: list[ChildOutcome]
    """Those of the watched trajectories found closed (at least one)."""
