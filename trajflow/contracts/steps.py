"""What one optimizer step trains on and what it records: a trajectory's `TrainRef`, per-task `TaskStats`, the
`StepRecord` the training workflow keeps (re-exported by `trajflow.contracts.training`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from pydantic import Field, field_validator

from trajflow.contracts.trainer import NanSafeContract

_Model = NanSafeContract


def is_flat(rewards: Iterable[float]) -> bool:
    """A group whose rewards are all equal (compared exactly), or of fewer than two: its group-relative advantages are
    all zero, so it carries no learning signal (`trajflow.rl.advantages`; `[train] filter_flat_groups` drops it)."""
    values = list(rewards)
    return len(values) < 2 or max(values) == min(values)


def lag_histogram(lags: Iterable[int]) -> dict[int, int]:
    """Staleness (v_train - version) -> how many samples had it, by lag."""
    return dict(sorted(Counter(lags).items()))


class TrainRef(_Model):
    """One trajectory of a step's batch, as the trainer needs it: where it is, its group and its reward."""

    workflow_id: str
    trajectory_uri: str
    group: str
    reward: float
    policy_version: int
    task: str = ""
    """The task's name (`TaskConfig.name`; a user-started trajectory's own `task`, or "external")."""
    won: bool = False
    """Its last env reward was at least 1 (a win, as eval counts them)."""


class TaskStats(_Model):
    """Trajectories of one task trained on: in one step (`StepRecord.by_task`) or so far (`TrainingState.by_task`)."""

    trajectories: int = 0
    reward_mean: float = 0.0
    wins: int = 0
    """Of them, those whose last env reward was at least 1."""

    @classmethod
    def of(cls, refs: list[TrainRef]) -> dict[str, TaskStats]:
        """Per task name, the stats of `refs`."""
        out: dict[str, TaskStats] = {}
        for name in dict.fromkeys(r.task for r in refs):
            mine = [r for r in refs if r.task == name]
            mean = round(sum(r.reward for r in mine) / len(mine), 6)  # short in the history the state carries
            out[name] = cls(trajectories=len(mine), reward_mean=mean, wins=sum(r.won for r in mine))
        return out

    def plus(self, other: TaskStats) -> TaskStats:
        n = self.trajectories + other.trajectories
        total = self.reward_mean * self.trajectories + other.reward_mean * other.trajectories
        return TaskStats(trajectories=n, reward_mean=total / n if n else 0.0, wins=self.wins + other.wins)

    @property
    def success(self) -> float:
        """Wins over trajectories (0.0 for none)."""
        return self.wins / self.trajectories if self.trajectories else 0.0


class StepRecord(_Model):
    step: int
    """The version this step produced."""
    time_s: float
    """Seconds since the run started (workflow time)."""
    reward_mean: float
    trajectories: int
    stale_dropped_total: int
    staleness: dict[int, int] = Field(default_factory=dict)
    """v_train - version -> trajectories of this step trained at that staleness (a histogram: a list of every
    sample's lag grew with B in the history the state carries). An old record's list is read as its histogram."""
    metrics: dict[str, float] = Field(default_factory=dict)
    train_s: float = 0.0
    wins: int = 0
    """Trajectories of the batch whose last env reward was at least 1."""
    flat_groups_dropped: int = 0
    """`[train] filter_flat_groups`: flat groups dropped (and replaced) since the previous step's record."""
    by_task: dict[str, TaskStats] = Field(default_factory=dict)
    """In a run of several tasks, task name -> its trajectories in this step's batch (absent: none of that task);
    empty in a one-task run (the step's own figures are that task's), so the history a run carries stays small."""

    @field_validator("staleness", mode="before")
    @classmethod
    def _histogram(cls, value: object) -> object:
        """A record written before the histogram (a continue-as-new input, a recorded history) lists every lag."""
        return lag_histogram(value) if isinstance(value, list) else value

    def task_stats(self, tasks: list[str]) -> dict[str, TaskStats]:
        """Task name -> this step's trajectories of it: `by_task`, or in a one-task run the step's own figures."""
        if self.by_task or len(tasks) != 1:
            return self.by_task
        return {tasks[0]: TaskStats(trajectories=self.trajectories, reward_mean=self.reward_mean, wins=self.wins)}
