"""The trainer's configuration: the policy loss and its corrections, LoRA adapters, and the optimizer settings
every train step carries (`TrainerConfig`, a run config's `[train] trainer`). Re-exported by
`trajflow.contracts.training`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from trajflow.contracts.base import Contract


class NanSafeContract(Contract):
    # NaN/inf as JSON constants, not `null`, so a diverged step's NaN loss in `metrics` still decodes.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")


LossKind = Literal["ppo_clip", "tis", "cispo", "topr", "decoupled_ppo"]


class LossConfig(NanSafeContract):
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


CreditMode = Literal["trajectory", "step_groups", "tree"]


class CreditConfig(NanSafeContract):
    """How a trajectory's outcome is credited to its turns (`trajflow.rl.credit`; docs/training.md, "Per-turn
    credit"). Every mode normalises like the group advantage (`normalize_adv_std`)."""

    mode: CreditMode = "trajectory"
    """`trajectory`: one group-relative advantage per trajectory, on every generated token (GRPO / Dr. GRPO).
    `step_groups`: GiGPO (Feng et al. 2025): the trajectory's advantage plus `step_weight` x a step advantage per
    turn, its discounted return relative to the group's turns that acted from the same observation. `tree`: for
    branched rollouts: per turn, the change in mean outcome of the group's trajectories that share the exact token
    prefix through that turn; a group without shared prefixes gets the trajectory advantage at every turn."""
    step_weight: Annotated[float, Field(ge=0.0, le=100.0)] = 1.0
    """step_groups: omega, the weight of the step advantage beside the episode advantage (GiGPO's 1)."""
    discount: Annotated[float, Field(gt=0.0, le=1.0)] = 0.95
    """step_groups: gamma, the discount of a turn's return: the outcome R at the last turn T counts gamma^(T - t)
    at turn t (GiGPO's 0.95)."""


LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The attention and MLP projections of a Llama-style decoder block (Llama, Qwen2, SmolLM2, Mistral)."""


class LoraConfig(NanSafeContract):
    """Low-rank adapters (LoRA, through `peft`): the base weights stay frozen and each targeted linear layer W
    gains a trained update (alpha / rank) * B A. Decode workers receive the merged weights W + (alpha / rank) B A
    as an ordinary checkpoint (`trajflow.rl.lora`)."""

    rank: Annotated[int, Field(ge=1, le=4096)] = 16
    """r: the inner dimension of B (out x r) and A (r x in)."""
    alpha: Annotated[int, Field(ge=1, le=1_000_000)] = 32
    """The update is scaled by alpha / rank."""
    target_modules: Annotated[list[str], Field(min_length=1)] = Field(default_factory=lambda: list(LLAMA_PROJECTIONS))
    """Names (last path component) of the linear layers that get adapters, in every block. The default is every
    attention and MLP projection of a Llama-style block; other architectures name theirs differently."""
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    """Dropout on the adapters' input during the trainer's forward passes (the base model keeps no dropout)."""


class TrainerConfig(NanSafeContract):
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
    credit: CreditConfig = CreditConfig()
    """Per-turn credit: which advantage each turn's tokens get (`CreditConfig`); the default is one per trajectory."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Trainer weights and optimizer state dtype; published weights are written in the decode dtype."""
    autocast: Literal["auto", "bf16", "off"] = "auto"
    """Mixed precision: forward and backward matmuls in bfloat16 under torch.autocast, weights, optimizer and
    logprobs in float32. `auto` turns it on where the trainer's device runs bf16 natively (a CUDA GPU, a CPU
    with AVX512-BF16 or AMX: about twice as fast) and off where bf16 would be emulated (~25x slower there);
    `bf16` forces it on, `off` off. See `trajflow.rl.precision`."""

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
    def _credit_fits_the_loss(self) -> TrainerConfig:
        if self.credit.mode != "trajectory" and self.loss.kind == "topr":
            raise ValueError(
                f"trainer.credit.mode {self.credit.mode!r} gives each turn its own advantage, but loss topr's "
                "truncated weight is the whole sequence's importance ratio, derived for one reward per sequence: "
                "with advantages whose sign changes within a sequence it is not TOPR's estimator. Use "
                "credit.mode = 'trajectory' with topr, or another loss kind (ppo_clip, tis, cispo, decoupled_ppo)"
            )
        return self

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
        """`simulate_step_s` was removed (benchmarks register their own simulated trainer,
        `trajflow.lab.bench.sim_trainer`); inputs recorded before (running workflows, trajflow/cli/replay/histories/)
        still carry it, and must still decode."""
        if isinstance(data, dict) and "simulate_step_s" in data:
            return {k: v for k, v in data.items() if k != "simulate_step_s"}
        return data
