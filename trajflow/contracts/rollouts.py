"""How a training run rolls out a group: n independent samples (`groups`, the default) or a tree (`tree`) of R roots
and n - R branches of them (`RolloutConfig`, a run config's `[train] rollout`); and what tree rollouts refuse.

Tree rollouts (docs/training.md, "Tree rollouts"): a group of n = group_size keeps its budget of n trajectories; R
roots start as a plain group's members do, the other n - R are branches (`TrajectoryRequest.branch_of`) of the
group's completed roots, each started when its root completes. The plan (which root, which turn) is
`trajflow.workflows.trees`. Limits: direct runs only (a sharded run is refused), no redundancy, no agent envs (they
cannot be branched).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal, Protocol

from pydantic import Field

from trajflow.contracts.agent import is_agent
from trajflow.contracts.base import Contract, MutableContract

RolloutMode = Literal["groups", "tree"]


class RolloutConfig(Contract):
    """How each group's n trajectories are rolled out (docs/training.md, "Tree rollouts")."""

    mode: RolloutMode = "groups"
    """`groups`: n independent samples of the seed (today's path). `tree`: `roots` independent samples, and n - roots
    branches of them: a branch replays its root's turns 1..k-1 and samples from turn k on, k drawn from the run's
    seed (uniform over 2..the root's turns, so that it shares at least one turn; 1 for a one-turn root), so the
    group's trajectories share prefixes that `[train.trainer.credit] mode = "tree"` credits per turn."""
    roots: Annotated[int, Field(ge=1, le=1023)] = 1
    """tree: R, the group's roots (1 <= R < group_size); the n - R branches are spread over them round robin."""


class _Settings(Protocol):
    """What `problems` reads of a `[train]` section (`trajflow.contracts.training.TrainSettings`)."""

    rollout: RolloutConfig
    group_size: int
    redundancy: int

    def shard_groups(self) -> int: ...


def problems(train: _Settings, env_ids: Iterable[str]) -> list[str]:
    """Why a `[train]` section's tree rollouts cannot run with tasks of `env_ids` (empty when they can, or with
    `groups`)."""
    rollout, group_size, redundancy = train.rollout, train.group_size, train.redundancy
    if rollout.mode != "tree":
        return []
    found: list[str] = []
    if rollout.roots >= group_size:
        found.append(
            f"rollout.roots ({rollout.roots}) must be less than group_size ({group_size}): a tree needs a branch"
        )
    if redundancy:
        found.append(f"tree rollouts take no redundancy (got {redundancy}): a branch waits for its root to complete")
    if train.shard_groups() > 0:
        found.append(
            "tree rollouts run in direct runs only: set groups_per_shard = 0 (a sharded run's shards do not branch)"
        )
    agents = sorted({e for e in env_ids if is_agent(e)})
    if agents:
        found.append(f'tree rollouts cannot branch agent envs ({", ".join(agents)}): use mode = "groups"')
    return found


class TreeRoot(Contract):
    """A completed root of a tree group: what its branches start from."""

    workflow_id: str
    record_uri: str
    turns: Annotated[int, Field(ge=0)]
    """Its turns (from its report): a branch's turn is drawn from 2..turns."""


class BranchPlan(Contract):
    """One branch to start: its root, the turn it samples from, and its index among the group's branches."""

    parent: str
    """The root's workflow id (`TrajectoryRequest.branch_of`)."""
    record_uri: str
    """The root's record (`branch_record`)."""
    turn: Annotated[int, Field(ge=1)]
    """k, 1-based (`branch_turn`)."""
    index: Annotated[int, Field(ge=0)]
    """The b-th branch planned for the group, replacements included (`branch_index`)."""


class TreeState(MutableContract):
    """A tree group's roots and branches, in its `GroupState` (carried through continue-as-new)."""

    roots: list[TreeRoot] = Field(default_factory=list)
    """Its completed roots, in the order they completed."""
    branches: list[str] = Field(default_factory=list)
    """Workflow ids of the members started as branches (the others are roots)."""
    queued: list[BranchPlan] = Field(default_factory=list)
    """Branches planned and not yet started (the admission loop starts them)."""
    next_index: int = 0
    """The index of the next replacement branch (the first n - R indices are the roots' shares)."""
