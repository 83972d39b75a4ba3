"""Inputs, results, state and config of the training workflow and the trainer: everything of training that
crosses Temporal.

The run is described by one `TrainingRunConfig` (every field defaulted, so `{}` from the Temporal UI starts a
small default run). The trainer step takes references to trajectories in the object store, never tokens.
Policy version `v` = number of completed optimizer steps; version 0 is the initial model.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, model_validator

from trajflow.contracts import capacity
from trajflow.contracts.capacity import MAX_CHILDREN_IN_FLIGHT as MAX_CHILDREN_IN_FLIGHT
from trajflow.contracts.children import ChildOutcome as ChildOutcome
from trajflow.contracts.children import WatchChildrenInput as WatchChildrenInput
from trajflow.contracts.children import WatchChildrenResult as WatchChildrenResult
from trajflow.contracts.evaluation import EvalConfig as EvalConfig
from trajflow.contracts.limits import PoolName, WorkflowIdRef
from trajflow.contracts.rollouts import RolloutConfig, TreeState, problems
from trajflow.contracts.shards import BatchStats, GroupSpec, Ranges, ShardedState
from trajflow.contracts.steps import StepRecord as StepRecord
from trajflow.contracts.steps import TaskStats as TaskStats
from trajflow.contracts.steps import TrainRef as TrainRef
from trajflow.contracts.tasks import TaskConfig
from trajflow.contracts.trainer import CreditConfig as CreditConfig
from trajflow.contracts.trainer import LoraConfig as LoraConfig
from trajflow.contracts.trainer import LossConfig as LossConfig
from trajflow.contracts.trainer import LossKind as LossKind
from trajflow.contracts.trainer import NanSafeContract, TrainerConfig
from trajflow.contracts.trajectory import derive_seed

_Model = NanSafeContract


class TrainSettings(_Model):
    """How much to train and how stale a sample may be: a run config's `[train]` section."""

    steps: Annotated[int, Field(ge=1, le=1_000_000)] = 4
    """Optimizer steps to take; the run ends at policy version `steps`."""
    batch_size: Annotated[int, Field(ge=1, le=100_000)] = 8
    """B: trajectories per optimizer step; a multiple of group_size."""
    group_size: Annotated[int, Field(ge=1, le=1024)] = 4
    """n: samples of one prompt (seed) trained together, advantages relative to the group."""
    redundancy: Annotated[int, Field(ge=0, le=1024)] = 0
    """r: extra samples started per group; the first n to complete make the group, the rest are cancelled."""
    alpha: Annotated[int, Field(ge=0, le=1000)] = 1
    """Staleness bound: a sample of version u may be trained on at trainer version v only if v - u <= alpha."""
    sync: bool = False
    """Batch barrier (needs alpha = 0): generate B, train, repeat. The baseline every speed claim is
    measured against."""
    first_seed: int = 0
    """Group k rolls out env seed first_seed + k."""
    seed: int = 0
    """The run's seed: each trajectory samples with a seed derived from it, its group's env seed and its index
    in the group (`member_seed`; each turn then from that and the turn index), and the trainer's shuffling
    is seeded by it (`trainer.seed` follows it). Same seed, same config, `sync` without redundancy: the same
    rewards per step (docs/training.md, "Reproducible runs", says what async and redundancy leave to timing)."""
    max_group_restarts: Annotated[int, Field(ge=0, le=1000)] = 4
    """Replacement samples started for a group whose members failed before it has n completed; past it the
    group is abandoned (counted)."""
    trainer: TrainerConfig = TrainerConfig()
    trainer_pool: PoolName = "default"
    """The trainer worker pool (task queue) that runs the optimizer steps."""
    eval: EvalConfig = EvalConfig()
    pause_after_infra_failures: Annotated[int, Field(ge=1, le=100_000)] = 8
    """Admission stops (loudly: status `paused`, an error log, the progress query) after this many infra-failed
    trajectories in a row with none completed between them: a systemic failure (the Docker engine gone, a
    pool down) must not burn through every trajectory of the run."""
    pause_probe_s: Annotated[float, Field(gt=0, le=86_400)] = 60.0
    """While paused, one probe group is admitted after this long (doubling up to 10 min); a completed
    trajectory resumes admission, as does the `resume_admission` signal."""
    history_events_before_continue: Annotated[int, Field(ge=50, le=40_000)] = 10_000
    """The workflow continues as new once its history holds this many events (Temporal's limit is 51,200)."""
    filter_flat_groups: bool = False
    """DAPO's dynamic sampling: a group of the run's own whose rewards are all equal (no GRPO signal) is left out of
    the batch and a new group (the next seed) is admitted in its place, so each step trains on groups with signal.
    Counted (`flat_groups_dropped`), never as lost. Needs group_size >= 2 (docs/training.md, "Dynamic sampling")."""
    max_flat_groups_per_step: Annotated[int, Field(ge=1, le=100_000)] = 16
    """With `filter_flat_groups`: the most flat groups dropped between two steps. Past it, flat groups are trained
    on (zero advantage, as without the filter; counted `flat_groups_trained`, logged) until the next step, so a
    policy whose every group is flat (one that never wins) still trains its steps, at a bounded cost: a step
    rolls out at most B/n + this many groups."""
    rollout: RolloutConfig = RolloutConfig()
    """How each group's n trajectories are rolled out: independent samples, or a tree of roots and branches."""
    groups_per_shard: Annotated[int, Field(ge=0, le=2_000)] | None = None
    """0: a direct run, every trajectory a child of the training workflow that reports to it (up to 512 in flight,
    `capacity.DIRECT_MAX_IN_FLIGHT`). N > 0: a sharded run (docs/capacity.md): the training workflow starts shard
    workflows of up to N groups, each the parent of its groups' trajectories, which report one message a group, so
    the training workflow's state holds group ranges and counters, independent of the batch. Unset: direct up to
    512 trajectories in flight, shards of 64 groups beyond."""

    @model_validator(mode="after")
    def _consistent(self) -> TrainSettings:
        if self.batch_size % self.group_size:
            raise ValueError(f"batch_size ({self.batch_size}) must be a multiple of group_size ({self.group_size})")
        if self.trainer.mini_batches > self.batch_size:
            raise ValueError(
                f"trainer.mini_batches ({self.trainer.mini_batches}) must not exceed batch_size ({self.batch_size})"
            )
        if self.sync and self.alpha != 0:
            raise ValueError(f"sync mode is the alpha = 0 barrier; got alpha = {self.alpha}")
        if self.trainer.seed not in (0, self.seed):
            raise ValueError(
                f"trainer.seed ({self.trainer.seed}) differs from the run's seed ({self.seed}); set [train] seed "
                "alone: every step's trainer seed follows it"
            )
        for problem in self.limit_problems() + problems(self, ()):
            raise ValueError(problem)
        if self.filter_flat_groups and self.group_size < 2:
            raise ValueError("filter_flat_groups needs group_size >= 2: every group of one sample is flat")
        groups_needed = (
            (self.steps + self.alpha + 1) * self.batch_size // self.group_size * (1 + self.max_group_restarts)
        ) + (self.steps * self.max_flat_groups_per_step if self.filter_flat_groups else 0)  # flat groups' replacements
        if self.first_seed <= self.eval.first_seed < self.first_seed + groups_needed:
            raise ValueError(
                f"training seeds start at {self.first_seed} and may reach {self.first_seed + groups_needed}; "
                f"eval.first_seed ({self.eval.first_seed}) must lie outside them (held-out seeds)"
            )
        return self

    def max_in_flight(self) -> int:
        """The most trajectories admission keeps running at once: (α + 1)·B/n groups of n + r."""
        return (self.alpha + 1) * (self.batch_size // self.group_size) * (self.group_size + self.redundancy)

    def max_groups_in_flight(self) -> int:
        """(α + 1)·B/n: the groups admission keeps open or waiting to be trained on."""
        return capacity.groups_in_flight(self.alpha, self.batch_size, self.group_size)

    def shard_groups(self) -> int:
        """`groups_per_shard` as the run uses it (0: direct), the default resolved by the run's size."""
        return capacity.effective_groups_per_shard(
            self.groups_per_shard, self.max_in_flight(), self.group_size, self.redundancy, self.max_group_restarts
        )

    def shard_size(self) -> int:
        """The groups of a full shard (`trajflow.contracts.capacity.shard_size`)."""
        return capacity.shard_size(self.shard_groups(), self.max_groups_in_flight())

    def max_shards_in_flight(self) -> int:
        """Full shards to hold every group in flight, one partial shard and a probe's."""
        return capacity.shards_in_flight(self.max_groups_in_flight(), self.shard_size())

    def limit_problems(self) -> list[str]:
        """Why this config would pass one of Temporal's limits on one workflow execution (empty when it fits)."""
        return capacity.limit_problems(
            alpha=self.alpha,
            batch_size=self.batch_size,
            group_size=self.group_size,
            redundancy=self.redundancy,
            max_group_restarts=self.max_group_restarts,
            groups_per_shard=self.shard_groups(),
        )

    def member_seed(self, group_seed: int, member: int) -> int:
        """The sampling seed of the `member`-th trajectory started for the group of env seed `group_seed`: fixed
        by the run's seed whatever the timing, and different for each member of a group."""
        return derive_seed(self.seed, group_seed, member)


class TrainStepInput(_Model):
    run_id: str
    version: int
    """The trainer's version before this step; the step publishes version + 1."""
    refs: list[TrainRef]
    trainer: TrainerConfig
    groups: Ranges = Field(default_factory=list)
    """A sharded run's groups of this step, as ranges `[start, end)` of group indices (in JSON, `flat_ranges`): the
    trainer reads each group's `GroupManifest` from the store (after `refs`, which then holds user-started
    trajectories only)."""


class TrainStepResult(_Model):
    version: int
    """The new policy version (input version + 1)."""
    weights_uri: str | None
    """Where the new weights are in the store (None when simulated)."""
    metrics: dict[str, float] = Field(default_factory=dict)
    seconds: float = 0.0
    resumed: bool = False
    """True when this step's result was found already published (a retried step is not trained twice)."""
    batch: BatchStats | None = None
    """The figures of the samples trained on (reward, wins, staleness, per task), from the trainer: what a sharded
    run's step record is made of. None from a trainer older than it."""


class TrainingRunConfig(TrainSettings):
    """One training run: the settings and what to roll out."""

    tasks: list[TaskConfig] = Field(default_factory=lambda: [TaskConfig()], min_length=1)
    """What to roll out; groups are drawn from the tasks in proportion to their weights."""

    @model_validator(mode="after")
    def _norm_length_given(self) -> TrainingRunConfig:
        for problem in problems(self, [t.env_id for t in self.tasks]):
            raise ValueError(problem)
        loss = self.trainer.loss
        if loss.aggregation == "token_sum_norm" and loss.norm_length is None:
            longest = max(t.max_turns * t.sampling.max_new_tokens for t in self.tasks)
            raise ValueError(
                "trainer.loss.aggregation token_sum_norm divides each sequence's summed loss by the constant "
                f"trainer.loss.norm_length, which is not set; this config's tasks generate at most {longest} tokens "
                "a sample (max_turns x sampling.max_new_tokens): set norm_length to that"
            )
        return self


class GroupState(_Model):
    """One group of samples (one seed) as the training workflow tracks it."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    group: str
    seed: int
    task: int
    """Index into `TrainingRunConfig.tasks`."""
    started_version: int
    members_started: int = 0
    running: list[str] = Field(default_factory=list)
    """Workflow ids still running."""
    completed: list[TrainRef] = Field(default_factory=list)
    failed: int = 0
    external: bool = False
    """Made of trajectories a user started with this run's id, not by the workflow."""
    tree: TreeState | None = None
    """Tree rollouts (`rollout.mode = "tree"`): the group's roots and branches; None for a plain group."""


class TrainingCounters(_Model):
    model_config = ConfigDict(extra="forbid", frozen=False)

    started: int = 0
    completed: int = 0
    failed: int = 0
    infra_failed: int = 0
    cancelled: int = 0
    """Redundant samples cancelled once their group was full."""
    external: int = 0
    """Reports from trajectories the workflow did not start (a user started them with this run id)."""
    duplicates: int = 0
    """Reports ignored because that trajectory's completed sample was already in its group."""
    late: int = 0
    """Reports ignored because their group was already full, trained on, dropped or abandoned (a redundant
    sample that finished before its cancellation landed)."""
    consumed: int = 0
    """Trajectories trained on."""
    dropped_stale: int = 0
    groups_abandoned: int = 0
    max_in_flight: int = 0
    admission_pauses: int = 0
    """Times admission stopped on a run of infra failures (see `pause_after_infra_failures`)."""
    flat_groups_dropped: int = 0
    """`filter_flat_groups`: complete groups of equal rewards left out of the batches and replaced (never lost)."""
    flat_groups_trained: int = 0
    """`filter_flat_groups`: flat groups trained on because `max_flat_groups_per_step` were dropped already."""


class StopRequest(_Model):
    """Asks a training run to end early (the `stop` signal, `trajflow stop RUN`)."""

    now: bool = False
    """False: stop admitting, train the current step (the one being trained, or else the batch the running
    trajectories can still complete), then cancel the rest. True: cancel every running trajectory at once and
    train only a step the trainer already has."""
    reason: str = "stopped by request"
    """Why, as the result and the logs say it."""
    at_version: int = 0
    """Set by the workflow when the request arrives: the version after which the run ends."""


class TrainingState(_Model):
    """Everything the training workflow needs to continue: carried through continue-as-new whole."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    run_id: str = ""
    version: int = 0
    next_group: int = 0
    groups: dict[str, GroupState] = Field(default_factory=dict)
    closed_external: list[str] = Field(default_factory=list)
    """Digests of the most recently closed (trained, dropped) groups of user-started trajectories, oldest first, at
    most `trajflow.workflows.bookkeeping.EXTERNAL_CLOSED_KEPT`: a late report for one is ignored. The workflow's own
    groups need no such list: `g{k:06d}` with k < next_group that is not open is closed."""
    counters: TrainingCounters = Field(default_factory=TrainingCounters)
    task_groups: list[int] = Field(default_factory=list)
    """Groups started so far per task (index into `TrainingRunConfig.tasks`): the weighted choice of a task."""
    history: list[StepRecord] = Field(default_factory=list)
    by_task: dict[str, TaskStats] = Field(default_factory=dict)
    """Task name -> every trajectory of it trained on so far (kept whole, unlike `history`)."""
    started_at: float = 0.0
    """Workflow time (seconds) when the run began, kept across continue-as-new."""
    continued: int = 0
    """How many times the workflow continued as new."""
    infra_streak: int = 0
    """Infra-failed trajectories reported in a row, with none completed or failed by the env between them."""
    paused: str | None = None
    """Why admission is stopped (a run of infra failures and the last error), or None while admitting."""
    probe: bool = False
    """While paused: admit one probe group (or a queued replacement) now."""
    probe_delay_s: float | None = None
    """While paused: the wait before the next probe (doubling); None: `pause_probe_s`."""
    to_cancel: list[str] = Field(default_factory=list)
    """Members queued for cancellation (redundant samples of full groups, members of closed groups)."""
    replacements: dict[str, int] = Field(default_factory=dict)
    """Group -> replacement members to start for its failed ones, in the order queued."""
    step: TrainStepInput | None = None
    """The step being trained: a run that continues as new while the trainer works issues it again (the trainer
    answers a step it already took, or is taking, with that step's result)."""
    stopping: StopRequest | None = None
    """A stop asked for (the `stop` signal), with the version the run ends at; None while the run goes on."""
    flat_dropped_step: int = 0
    """Flat groups dropped since the last step (`filter_flat_groups`): at `max_flat_groups_per_step`, flat groups
    are trained on until the next step resets it."""
    sharded: ShardedState | None = None
    """A sharded run's groups and shards (`groups_per_shard` > 0; user-started trajectories stay in `groups`)."""


class TrainingStart(_Model):
    """What starts a TrainingWorkflow (the UI's one JSON input): `{}` runs the default config."""

    run: TrainingRunConfig = TrainingRunConfig()
    resume: TrainingState | None = None
    """Set by continue-as-new to carry the state over; leave it out when starting a run."""


class TrainingResult(_Model):
    run_id: str
    version: int
    counters: TrainingCounters
    history: list[StepRecord]
    wall_seconds: float
    by_task: dict[str, TaskStats] = Field(default_factory=dict)
    """Task name -> every trajectory of it trained on in the run."""
    stopped: str | None = None
    """Why the run ended before its last step (a `StopRequest`'s reason, at which version); None when it ran all
    its steps."""


PROGRESS_RECENT_STEPS = 16
"""Step records the `progress` query carries (`TrainingProgress.recent`)."""


class TrainingProgress(_Model):
    """What the `progress` query answers."""

    run_id: str
    version: int
    steps: int
    alpha: int
    running: int
    buffered: int
    """Completed samples waiting in groups that are not yet trained on."""
    counters: TrainingCounters
    last: StepRecord | None
    elapsed_s: float
    paused: str | None = None
    """Why admission is stopped, while it is."""
    recent: list[StepRecord] = Field(default_factory=list)
    """The last `PROGRESS_RECENT_STEPS` step records, oldest first (`last` is the final one): a view polling every
    few seconds sees every step even when several finish between two polls. Empty from a worker older than it."""
    tasks: list[str] = Field(default_factory=list)
    """The run's task names, in config order."""
    by_task: dict[str, TaskStats] = Field(default_factory=dict)
    """Task name -> every trajectory of it trained on so far (the last step's are in `last.by_task`)."""
    stopping: str | None = None
    """While a stop is under way: its reason and the version the run ends at."""


class ShardStart(_Model):
    """What starts a `ShardWorkflow` of a sharded run (its workflow id: `trajflow.contracts.shards.shard_id`)."""

    run: TrainingRunConfig
    run_id: WorkflowIdRef
    """The training run: its trajectories' run and policy, and where the shard's reports go."""
    groups: list[GroupSpec] = Field(min_length=1)
    min_policy_version: Annotated[int, Field(ge=0)] = 0
    """The trainer's version when the shard was admitted: its trajectories sample from it or newer."""
