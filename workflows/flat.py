"""DAPO's dynamic sampling (`[train] filter_flat_groups`), pure: whether a complete group of the run's own is left out
of the batch because its rewards are all equal (no GRPO signal), counted in the workflow's `TrainingState`. Like
`trajflow.workflows.pause`, stdlib and `contracts` only; both the direct run's `Book` and the sharded run's `ShardBook`
ask it when a group completes, so the rule lives here once.

A dropped group is closed without being consumed: it leaves the admission budget's `running` term, so the admission
loop starts a new group (the next seed) in its place. At most `max_flat_groups_per_step` are dropped between two
steps; past that, flat groups are trained on (zero advantage, as without the filter) until the next step, so a run
whose every group is flat still ends, and a step never rolls out more than B/n + that many groups.

Limits: user-started trajectories' groups are never dropped (nothing of the run's would replace them). In a sharded
run a dropped group's manifest stays in the store, unread (its shard writes it before the training workflow decides).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from trajflow.contracts.steps import is_flat
from trajflow.contracts.training import TrainingRunConfig, TrainingState

Verdict = Literal["dropped", "trained"] | None
"""`dropped`: left out and replaced; `trained`: flat but the step's drops are spent; None: not flat, or no filter."""


def verdict(s: TrainingState, cfg: TrainingRunConfig, rewards_flat: bool) -> Verdict:
    """Decide on one complete group of the run's own, flat or not (`group_is_flat`), and count it
    (`TrainingCounters.flat_groups_*`)."""
    if not cfg.filter_flat_groups or not rewards_flat:
        return None
    if s.flat_dropped_step >= cfg.max_flat_groups_per_step:
        s.counters.flat_groups_trained += 1
        return "trained"
    s.flat_dropped_step += 1
    s.counters.flat_groups_dropped += 1
    return "dropped"


def group_is_flat(cfg: TrainingRunConfig, rewards: Iterable[float]) -> bool:
    """With the filter on, whether these rewards of a complete group are all equal (`contracts.steps.is_flat`, as the
    advantages decide); always False with it off, so a run without it computes nothing new."""
    return cfg.filter_flat_groups and is_flat(rewards)


def step_done(s: TrainingState) -> int:
    """A step was trained: the flat groups dropped since the previous one (for its record); the count starts again."""
    dropped, s.flat_dropped_step = s.flat_dropped_step, 0
    return dropped
