"""What `trajflow train` writes when a run ends (the held-out evaluations and the run's `summary.json`) and what
`trajflow eval --json` writes (one `EvalResult`).

Written with `model_dump_json` and read back with `model_validate_json` (scripts/plot_runs.py, tests); the JSON
keys are the ones docs/training.md lists. Not a Temporal contract (nothing here crosses a workflow boundary), but kept
beside them so every file trajflow writes has one schema.
"""

from __future__ import annotations

from pydantic import Field

from trajflow.contracts.base import Contract
from trajflow.contracts.training import LossKind, TrainingCounters
from trajflow.contracts.trajectory import TrajectoryStatus


class EpisodeEval(Contract):
    """One held-out seed of an evaluation: its greedy episode and, with samples, its sampled episodes."""

    seed: int
    task: str
    """The task's name in the run config (tasks take turns over the seeds)."""
    greedy_status: TrajectoryStatus
    greedy_reward: float | None
    """The greedy episode's reward; None when it was not scored (failed or infra-failed)."""
    greedy_win: bool
    """The greedy episode's last env reward was at least 1."""
    sample_wins: int = 0
    """Sampled episodes that won; one that was not scored counts as a loss."""
    sample_rewards: list[float | None] = Field(default_factory=list)
    """Each sampled episode's reward (None: not scored), in the order they were started."""


class EvalResult(Contract):
    """Rollouts of the held-out seeds with one policy version: one greedy episode per seed (success rate, mean
    reward) and, with `samples` = k > 0, k more per seed at the task's sampling temperature (pass@1..pass@k)."""

    version: int
    """The policy version evaluated (0: the initial model)."""
    episodes: int
    scored: int
    """Greedy episodes that completed and were scored."""
    not_completed: int
    """Greedy episodes that failed or were infra-failed: counted as losses in the success rate."""
    success_rate: float
    """Greedy episodes whose last env reward was at least 1 (a win), over all episodes."""
    mean_reward: float
    """Mean reward of the scored greedy episodes (0.0 when none was)."""
    seconds: float
    policy: str = ""
    """The training run whose weights were evaluated, pinned to `version` ("": the base model)."""
    samples: int = 0
    """k: sampled episodes per seed (0: greedy only)."""
    temperature: float | None = None
    """The sampling temperature of the samples (the first task's; each task samples at its own)."""
    pass_at_k: dict[int, float] = Field(default_factory=dict)
    """k -> pass@k for k = 1..samples: per seed the unbiased estimator 1 - C(n-c, k)/C(n, k) of Chen et al.
    (2021) from its n = samples sampled episodes, c of them wins; averaged over the seeds."""
    per_episode: list[EpisodeEval] = Field(default_factory=list)
    """One row per held-out seed, in seed order."""


class CurvePoint(Contract):
    """One point of a run's held-out success by step (`RunSummary.eval_curve`): a greedy eval of one version on the
    same first held-out seeds as every other point (`[train.eval] during_episodes` of them)."""

    version: int
    successes: int
    """Greedy wins (an episode that did not complete counts as a loss)."""
    episodes: int
    rate: float
    """successes / episodes."""
    mean_reward: float
    """Mean reward of the scored greedy episodes (0.0 when none was)."""
    seconds: float
    """Wall seconds of this eval (0.0 for the points taken from the evals before and after training)."""

    @classmethod
    def of(cls, result: EvalResult, episodes: int | None = None) -> CurvePoint:
        """The point of `result`'s first `episodes` seeds (all of them when None)."""
        rows = result.per_episode[:episodes] if episodes is not None else result.per_episode
        rewards = [r.greedy_reward for r in rows if r.greedy_reward is not None]
        wins = sum(r.greedy_win for r in rows)
        return cls(
            version=result.version,
            successes=wins,
            episodes=len(rows),
            rate=wins / len(rows) if rows else 0.0,
            mean_reward=sum(rewards) / len(rewards) if rewards else 0.0,
            seconds=result.seconds if episodes is None else 0.0,
        )


class TaskEval(Contract):
    """One task's share of an evaluation: its greedy episodes (the eval's tasks take turns over the seeds)."""

    episodes: int
    wins: int
    success_rate: float
    """Greedy wins over this task's episodes (0.0 when it had none)."""
    mean_reward: float
    """Mean reward of this task's scored greedy episodes (0.0 when none was)."""


class TaskSummary(Contract):
    """One task of a run as `summary.json` keeps it (`RunSummary.tasks`)."""

    trajectories_trained: int
    wins: int
    """Of them, those whose last env reward was at least 1."""
    reward_by_step: list[float | None] = Field(default_factory=list)
    """Mean reward of this task's trajectories in each step's batch (None: none of them in that step)."""
    success_by_step: list[float | None] = Field(default_factory=list)
    """Wins over this task's trajectories in each step's batch (None: none of them in that step)."""
    eval_before: TaskEval | None = None
    eval_after: TaskEval | None = None


class RunSummary(Contract):
    """A training run as `summary.json` keeps it."""

    run_id: str
    eval_before: EvalResult | None
    """None when the run was not evaluated (`--no-eval`, or `[train.eval] episodes = 0`)."""
    eval_after: EvalResult | None
    steps: int
    """Optimizer steps taken: the final policy version."""
    trajectories_trained: int
    trajectories_dropped_stale: int
    flat_groups_dropped: int = 0
    """`[train] filter_flat_groups`: groups whose rewards were all equal, left out and replaced (never lost)."""
    flat_groups_dropped_by_step: list[int] = Field(default_factory=list)
    """Of them, those dropped since the previous step, per step (those dropped after the last step: in the total)."""
    wall_seconds: float
    trajectories_per_s: float
    """Completed trajectories per second of wall time."""
    alpha: int
    sync: bool
    batch_size: int
    group_size: int
    loss: LossKind
    counters: TrainingCounters
    staleness_histogram: dict[str, int] = Field(default_factory=dict)
    """v_train - version -> trajectories trained at that staleness."""
    reward_by_step: list[float] = Field(default_factory=list)
    """Mean training reward of each step's batch."""
    time_by_step: list[float] = Field(default_factory=list)
    """Seconds since the run started at which each step ended."""
    last_metrics: dict[str, float] = Field(default_factory=dict)
    """The last step's trainer metrics (loss, clip fraction, rollout/trainer KL, ...)."""
    tasks: dict[str, TaskSummary] = Field(default_factory=dict)
    """Task name (config order) -> its trajectories trained, reward and success by step, held-out eval before and
    after (every task of the run, one-task runs too)."""
    stopped: str | None = None
    """Why the run ended before its last step (`trajflow stop`); None when it ran all its steps."""
    eval_curve: list[CurvePoint] = Field(default_factory=list)
    """Held-out greedy success by version, on the same `[train.eval] during_episodes` first held-out seeds: the
    evals during training (every `[train.eval] every` versions) and, from their first seeds, the evals before and
    after; in version order. Empty when `every` is 0."""
