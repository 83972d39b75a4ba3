"""Inputs, results, state and config of the training workflow and the trainer: everything of training that
crosses Temporal.

The run is described by one `TrainingRunConfig` (every field defaulted, so `{}` from the Temporal UI starts a
small default run). The trainer step takes references to trajectories in the object store, never tokens.
Policy version `v` = number of completed optimizer steps; version 0 is the initial model.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from contracts.base import Contract
from contracts.limits import PoolName
from contracts.tasks import TaskConfig
from contracts.trajectory import TrajectoryResult, derive_seed


class _Model(Contract):
    # NaN/inf as JSON constants, not `null`, so a diverged step's NaN loss in `metrics` still decodes.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")


LossKind = Literal["ppo_clip", "tis", "cispo", "topr", "decoupled_ppo"]


class LossConfig(_Model):
    """The policy loss and its off-policy correction. Ratios compare the trainer's policy with the rollout
    (behaviour) policy whose logprobs the decode worker recorded, except where noted."""

    kind: LossKind = "ppo_clip"
    """`ppo_clip` (GRPO's clipped surrogate against the rollout logprobs), `tis` (REINFORCE with a truncated
    importance weight), `cispo` (REINFORCE with a clipped, stop-gradient importance weight), `topr` (tapered
    off-policy REINFORCE: plain for positive advantages; for negative ones the weight is the sequence's
    importance ratio clipped to [0, 1]),
    `decoupled_ppo` (PPO-clip against the proximal policy, the trainer's own logprobs at the start of the step,
    times a capped behaviour weight)."""
    clip_low: Annotated[float, Field(ge=0.0, le=1.0)] = 0.2
    """PPO-clip lower bound: the ratio is clipped at 1 - clip_low (ppo_clip, decoupled_ppo, cispo)."""
    clip_high: Annotated[float, Field(ge=0.0, le=10.0)] = 0.28
    """PPO-clip upper bound: the ratio is clipped at 1 + clip_high (clip-higher, as in DAPO)."""
    tis_cap: Annotated[float, Field(gt=0.0)] = 2.0
    """TIS: the importance weight is min(ratio, tis_cap); decoupled_ppo: the cap of the behaviour weight."""
    aggregation: Literal["token_mean", "seq_mean", "token_sum_norm"] = "token_mean"
    """`token_mean` (DAPO's token-level): mean over every generated token of the batch; `seq_mean` (GRPO's
    sequence-level): mean per sequence, then over sequences; `token_sum_norm` (Dr. GRPO): each sequence's token
    losses summed and divided by the constant `norm_length`, then averaged over the batch's sequences, so no
    sequence is weighted by its own length."""
    norm_length: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    """`token_sum_norm`'s constant (Dr. GRPO's MAX_TOKENS): the longest generation a sample can have, in tokens,
    e.g. max_turns x sampling.max_new_tokens of the run's longest task. No default: `token_sum_norm` needs it
    (a run config says which value its tasks imply); the other aggregations ignore it."""
    kl_coef: Annotated[float, Field(ge=0.0)] = 0.0
    """Weight of the KL penalty to the frozen reference policy (the initial model), added to every generated
    token's loss and aggregated like it. 0: off, and the trainer holds no reference."""
    kl_estimator: Literal["k1", "k3"] = "k3"
    """Schulman's estimator of KL(policy || reference) per token, with log rho = ref - logp: `k1` = -log rho
    (unbiased, can be negative), `k3` = rho - 1 - log rho (unbiased, never negative, lower variance; GRPO's)."""
    entropy_coef: Annotated[float, Field(ge=0.0)] = 0.0
    """Weight of an entropy bonus: minus entropy_coef x the per-token entropy of the policy is added to every
    generated token's loss. 0: off (the entropy is still logged)."""


LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The attention and MLP projections of a Llama-style decoder block (Llama, Qwen2, SmolLM2, Mistral)."""


class LoraConfig(_Model):
    """Low-rank adapters (LoRA, through `peft`): the base weights stay frozen and each targeted linear layer W
    gains a trained update (alpha / rank) * B A. Decode workers receive the merged weights W + (alpha / rank) B A
    as an ordinary checkpoint (`rl.lora`)."""

    rank: Annotated[int, Field(ge=1, le=4096)] = 16
    """r: the inner dimension of B (out x r) and A (r x in)."""
    alpha: Annotated[int, Field(ge=1, le=1_000_000)] = 32
    """The update is scaled by alpha / rank."""
    target_modules: Annotated[list[str], Field(min_length=1)] = Field(default_factory=lambda: list(LLAMA_PROJECTIONS))
    """Names (last path component) of the linear layers that get adapters, in every block. The default is every
    attention and MLP projection of a Llama-style block; other architectures name theirs differently."""
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    """Dropout on the adapters' input during the trainer's forward passes (the base model keeps no dropout)."""


class TrainerConfig(_Model):
    loss: LossConfig = LossConfig()
    lr: Annotated[float, Field(gt=0.0, le=1.0)] = 1e-5
    """AdamW learning rate (constant)."""
    weight_decay: Annotated[float, Field(ge=0.0)] = 0.0
    grad_clip: Annotated[float, Field(gt=0.0)] = 1.0
    """Global gradient-norm clip."""
    micro_batch: Annotated[int, Field(ge=1, le=1024)] = 8
    """Sequences per forward/backward; gradients accumulate over a mini-batch's micro-batches into one optimizer
    update."""
    ppo_epochs: Annotated[int, Field(ge=1, le=100)] = 1
    """Passes over a step's batch; each pass makes one optimizer update per mini-batch."""
    mini_batches: Annotated[int, Field(ge=1, le=1024)] = 1
    """Mini-batches a step's batch is split into (after a seeded shuffle); at most the batch's size. A step makes
    ppo_epochs x mini_batches optimizer updates and still publishes one policy version."""
    seed: int = 0
    """Seeds the shuffle of each step's batch into mini-batches, mixed with the step's version so that every
    step shuffles differently and a rerun shuffles the same. A training run sets it from `[train] seed` in every
    step's input (so in a run config leave it out, or equal to that)."""
    normalize_adv_std: bool = True
    """GRPO advantages (r - group mean) / group std; False keeps r - group mean (Dr. GRPO)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Trainer weights and optimizer state dtype; published weights are written in the decode dtype."""
    autocast: Literal["auto", "bf16", "off"] = "auto"
    """Mixed precision: forward and backward matmuls in bfloat16 under torch.autocast, weights, optimizer and
    logprobs in float32. `auto` turns it on where the trainer's device runs bf16 natively (a CUDA GPU, a CPU
    with AVX512-BF16 or AMX: about twice as fast) and off where bf16 would be emulated (~25x slower there);
    `bf16` forces it on, `off` off. See `rl.precision`."""

    @model_validator(mode="before")
    @classmethod
    def _legacy_autocast_bf16(cls, data: object) -> object:
        # Recorded histories and older configs carry `autocast_bf16: bool` (true = bf16, false = off).
        if isinstance(data, dict) and "autocast_bf16" in data:
            data = dict(data)
            legacy = data.pop("autocast_bf16")
            data.setdefault("autocast", "bf16" if legacy else "off")
        return data

    train_last_layers: Annotated[int, Field(ge=0, le=1000)] = 0
    """0 trains every parameter. k > 0 trains only the last k transformer blocks and the final norm (embeddings
    and everything below frozen), so the backward pass stops at block L - k: much cheaper on CPU."""
    lora: LoraConfig | None = None
    """Set: train low-rank adapters only (every base weight frozen) instead of the weights themselves; excludes
    `train_last_layers`. See `LoraConfig`."""

    @model_validator(mode="after")
    def _one_way_to_freeze(self) -> TrainerConfig:
        if self.lora is not None and self.train_last_layers:
            raise ValueError(
                f"trainer.lora and trainer.train_last_layers ({self.train_last_layers}) are two ways to train part of "
                "the model; set one of them (train_last_layers = 0 with lora)"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _drop_simulate_step_s(cls, data: object) -> object:
        """`simulate_step_s` was removed (benchmarks register their own simulated trainer, `bench.sim_trainer`);
        inputs recorded before (running workflows, tests/histories/) still carry it, and must still decode."""
        if isinstance(data, dict) and "simulate_step_s" in data:
            return {k: v for k, v in data.items() if k != "simulate_step_s"}
        return data


class EvalConfig(_Model):
    episodes: Annotated[int, Field(ge=0, le=10_000)] = 50
    """Held-out episodes evaluated greedily before and after training by `trajflow train` (0: no eval)."""
    first_seed: int = 1_000_000
    """Held-out seeds are first_seed, first_seed+1, ...; training seeds must not reach them."""


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
    rewards per step (README "Reproducible runs" says what async and redundancy leave to timing)."""
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
        groups_needed = (self.steps + self.alpha + 1) * self.batch_size // self.group_size * (1 + self.max_group_restarts)
        if self.first_seed <= self.eval.first_seed < self.first_seed + groups_needed:
            raise ValueError(
                f"training seeds start at {self.first_seed} and may reach {self.first_seed + groups_needed}; "
                f"eval.first_seed ({self.eval.first_seed}) must lie outside them (held-out seeds)"
            )
        return self

    def member_seed(self, group_seed: int, member: int) -> int:
        """The sampling seed of the `member`-th trajectory started for the group of env seed `group_seed`: fixed
        by the run's seed whatever the timing, and different for each member of a group."""
        return derive_seed(self.seed, group_seed, member)


class TrainRef(_Model):
    """One trajectory of a step's batch, as the trainer needs it: where it is, its group and its reward."""

    workflow_id: str
    trajectory_uri: str
    group: str
    reward: float
    policy_version: int


class TrainStepInput(_Model):
    run_id: str
    version: int
    """The trainer's version before this step; the step publishes version + 1."""
    refs: list[TrainRef]
    trainer: TrainerConfig


class TrainStepResult(_Model):
    version: int
    """The new policy version (input version + 1)."""
    weights_uri: str | None
    """Where the new weights are in the store (None when simulated)."""
    metrics: dict[str, float] = Field(default_factory=dict)
    seconds: float = 0.0
    resumed: bool = False
    """True when this step's result was found already published (a retried step is not trained twice)."""


class TrainingRunConfig(TrainSettings):
    """One training run: the settings and what to roll out."""

    tasks: list[TaskConfig] = Field(default_factory=lambda: [TaskConfig()], min_length=1)
    """What to roll out; groups are drawn from the tasks in proportion to their weights."""

    @model_validator(mode="after")
    def _norm_length_given(self) -> TrainingRunConfig:
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


class StepRecord(_Model):
    step: int
    """The version this step produced."""
    time_s: float
    """Seconds since the run started (workflow time)."""
    reward_mean: float
    trajectories: int
    stale_dropped_total: int
    staleness: list[int] = Field(default_factory=list)
    """v_train - version of every trajectory trained on in this step."""
    metrics: dict[str, float] = Field(default_factory=dict)
    train_s: float = 0.0


class TrainingState(_Model):
    """Everything the training workflow needs to continue: carried through continue-as-new whole."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    run_id: str = ""
    version: int = 0
    next_group: int = 0
    groups: dict[str, GroupState] = Field(default_factory=dict)
    closed_external: list[str] = Field(default_factory=list)
    """Digests of the most recently closed (trained, dropped) groups of user-started trajectories, oldest first, at
    most `workflows.bookkeeping.EXTERNAL_CLOSED_KEPT`: a late report for one is ignored. The workflow's own groups
    need no such list: `g{k:06d}` with k < next_group that is not open is closed."""
    counters: TrainingCounters = Field(default_factory=TrainingCounters)
    task_groups: list[int] = Field(default_factory=list)
    """Groups started so far per task (index into `TrainingRunConfig.tasks`): the weighted choice of a task."""
    history: list[StepRecord] = Field(default_factory=list)
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


class WatchChildrenInput(_Model):
    """Trajectories a training run inherited through continue-as-new (its watchers did not survive it)."""

    workflow_ids: list[str] = Field(min_length=1)
    poll_s: Annotated[float, Field(gt=0, le=60)] = 2.0
    """How often their status is read."""


class ChildOutcome(_Model):
    workflow_id: str
    status: str
    """The closed execution's status: COMPLETED, FAILED, TERMINATED, CANCELED, TIMED_OUT, or NOT_FOUND."""
    result: TrajectoryResult | None = None
    """A completed trajectory's result (its report may have been lost)."""


class WatchChildrenResult(_Model):
    closed: list[ChildOutcome]
    """Those of the watched trajectories found closed (at least one)."""
