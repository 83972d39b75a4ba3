"""Token-level policy-gradient losses with off-policy corrections, the KL and entropy terms, and diagnostics.

Every loss sees, per generated token t of sequence i: the trainer's logprob `logp` (carries grad), the rollout
(behaviour) policy's logprob `b` recorded by the decode worker, its advantage `A` (the sequence's `A_i` given as
[B] and broadcast to its tokens, or each token's own given as [B, L]: per-turn credit), and a loss mask.
The ratio is r = exp(logp - b). `sg` is stop-gradient. Per-token losses:

- `ppo_clip`: -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A). The clipped surrogate of PPO (Schulman et al.
  2017, "Proximal Policy Optimization Algorithms") as GRPO uses it with group advantages (Shao et al. 2024,
  "DeepSeekMath"); `clip_high > clip_low` is DAPO's clip-higher (Yu et al. 2025).
- `tis`: -sg(min(r, tis_cap)) A logp. REINFORCE with a truncated importance weight, correcting the mismatch
  between the inference engine and the trainer (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings
  You Off-Policy RL Training").
- `cispo`: -sg(clip(r, 1 - clip_low, 1 + clip_high)) A logp. Clipped IS-weight policy optimisation (MiniMax
  2025, "MiniMax-M1"): the weight is clipped, but unlike PPO no token's gradient is dropped.
- `topr`: -A logp when A >= 0, -sg(clip(R_i, 0, 1)) A logp when A < 0, with R_i = exp(sum over the sequence's
  masked tokens of (logp - b)) the SEQUENCE's importance ratio pi(y|x) / mu(y|x). Tapered off-policy REINFORCE
  (Le Roux et al. 2025, "Tapered Off-Policy REINFORCE", arXiv 2503.14286, eq. for grad J_TOPR): positive
  examples get plain REINFORCE, negative ones a truncated sequence-level importance weight; the paper's reward
  (less its baseline c) is our group advantage A_i. Every token of a sequence gets the same weight. With [B, L]
  advantages the branch is taken token by token (by the sign of the token's A); the config refuses per-turn
  credit with topr (`TrainerConfig`), since the estimator is derived for one reward per sequence.
- `decoupled_ppo`: -w min(r' A, clip(r', 1 - clip_low, 1 + clip_high) A) with r' = exp(logp - prox) against the
  proximal policy's logprobs `prox` and w = sg(min(exp(prox - b), tis_cap)). Decoupled PPO (Hilton et al. 2021,
  "Batch Size-Invariance for Policy Optimization"), as AReaL uses it for asynchronous RL (Fu et al. 2025), with
  the behaviour weight capped as in TIS. The trainer takes `prox` from the policy at the start of the step,
  computed once before its first update (`trajflow.rl.trainer`), so later updates of the step see r' != 1 and clip.

Added to every token's loss before aggregation, when on:
- KL to a frozen reference (`kl_coef > 0`, reference logprobs `ref`): kl_coef x Schulman's estimator
  ("Approximating KL Divergence", 2020) of KL(policy || reference) with log rho = ref - logp: k1 = -log rho,
  k3 = rho - 1 - log rho (log rho clamped to [-20, 20] so that a far-off token cannot overflow). The
  gradient flows through logp, as in GRPO's k3 penalty.
- entropy bonus (`entropy_coef > 0`): -entropy_coef x H_t, H_t the entropy of the token's (temperature-scaled)
  distribution, which the caller computes from the logits with its gradient.

Aggregation: `token_mean` = sum of masked per-token losses / number of masked tokens (DAPO); `seq_mean` = mean
over sequences with at least one masked token of each sequence's masked mean (GRPO); `token_sum_norm` = mean over
those sequences of each sequence's masked sum / `norm_length` (Dr. GRPO, Liu et al. 2025, "Understanding
R1-Zero-Like Training": a constant, not each sequence's own length). A batch with no masked token gives a loss of
exactly 0 that still back-propagates (zero gradients, no NaN). `denominator` lets a caller that splits a batch
into micro-batches divide every part by the whole batch's token or sequence count (`loss_denominator`), so the
parts' losses and gradients sum to the whole batch's.

Metrics (floats, over masked tokens; all 0.0 when there are none): `kl_rollout_trainer` (k1 estimate of
KL(rollout || trainer): mean of b - logp), `kl_rollout_trainer_k3` (mean of r - 1 - log r, Schulman's k3),
`ratio_mean/max/min` (of r), `logprob_abs_diff_mean/max` (|logp - b|), `clip_frac` (fraction of tokens where the
chosen loss clipped or truncated something; for decoupled_ppo either the PPO clip on r' or the cap on w),
`is_weight_mean` (the weight w_t the token's gradient actually gets, d loss_t / d logp_t = -w_t A: r or 0 for
ppo_clip, the truncated/clipped weight for tis/cispo/topr, w r' or 0 for decoupled_ppo); with reference
logprobs `kl_ref` (mean of the chosen estimator), with entropies `entropy` (mean per-token entropy).
`merge_metrics` combines micro-batches: token-weighted means, max of maxima, min of minima.

Limits: no GSPO-style sequence-level ratios except TOPR's weight; the KL is to the initial model only (no moving
reference).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from trajflow.contracts.training import LossConfig

MAX_METRICS = frozenset({"ratio_max", "logprob_abs_diff_max"})
MIN_METRICS = frozenset({"ratio_min"})
METRIC_NAMES = (
    "kl_rollout_trainer",
    "kl_rollout_trainer_k3",
    "ratio_mean",
    "ratio_max",
    "ratio_min",
    "logprob_abs_diff_mean",
    "logprob_abs_diff_max",
    "clip_frac",
    "is_weight_mean",
)
KL_REF = "kl_ref"
ENTROPY = "entropy"

Tensor = torch.Tensor
_PerToken = tuple[Tensor, Tensor, Tensor]
"""(per-token loss, clipped/truncated flag, gradient weight), each [B, L]."""


@dataclass(frozen=True)
class _Tokens:
    """One batch's per-token inputs, all [B, L]: `adv` is broadcast from [B] or given per token, `ratio` =
    exp(logp - behaviour) on `valid` (1 elsewhere)."""

    logp: Tensor
    behaviour: Tensor
    ratio: Tensor
    adv: Tensor
    valid: Tensor
    prox: Tensor | None


def _ppo_terms(ratio: Tensor, adv: Tensor, lo: float, hi: float) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate (per-token loss) and where the clipped branch won (its gradient is zero there)."""
    surrogate = torch.minimum(ratio * adv, ratio.clamp(lo, hi) * adv)
    clipped = ((adv > 0) & (ratio > hi)) | ((adv < 0) & (ratio < lo))
    return -surrogate, clipped


def _ppo_clip(cfg: LossConfig, t: _Tokens) -> _PerToken:
    loss, clipped = _ppo_terms(t.ratio, t.adv, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    return loss, clipped, torch.where(clipped, 0.0, t.ratio.detach())


def _tis(cfg: LossConfig, t: _Tokens) -> _PerToken:
    r = t.ratio.detach()
    weight = r.clamp(max=cfg.tis_cap)
    return -weight * t.adv * t.logp, r > cfg.tis_cap, weight


def _cispo(cfg: LossConfig, t: _Tokens) -> _PerToken:
    lo, hi = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
    r = t.ratio.detach()
    weight = r.clamp(lo, hi)
    return -weight * t.adv * t.logp, (r < lo) | (r > hi), weight


def _topr(cfg: LossConfig, t: _Tokens) -> _PerToken:
    # pi(y|x) / mu(y|x) from the sum of the token log-ratios; an overflow to +inf is clipped to 1 below
    log_ratio = torch.where(t.valid, t.logp.detach() - t.behaviour, 0.0).sum(dim=1, keepdim=True)
    sequence = torch.exp(log_ratio).expand_as(t.logp)
    negative = t.adv < 0
    weight = torch.where(negative, sequence.clamp(0.0, 1.0), torch.ones_like(sequence))
    return -weight * t.adv * t.logp, negative & (sequence > 1.0), weight


def _decoupled_ppo(cfg: LossConfig, t: _Tokens) -> _PerToken:
    if t.prox is None:
        raise ValueError("decoupled_ppo needs prox_logprobs (the trainer's own logprobs before the update)")
    prox = t.prox.detach().to(t.logp.dtype)
    behaviour_weight = torch.exp(torch.where(t.valid, prox - t.behaviour, 0.0))
    w = behaviour_weight.clamp(max=cfg.tis_cap)
    prox_ratio = torch.exp(torch.where(t.valid, t.logp - prox, 0.0))
    surrogate, clipped = _ppo_terms(prox_ratio, t.adv, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    weight = torch.where(clipped, 0.0, w * prox_ratio.detach())
    return w * surrogate, clipped | (behaviour_weight > cfg.tis_cap), weight


_LOSSES: dict[str, Callable[[LossConfig, _Tokens], _PerToken]] = {
    "ppo_clip": _ppo_clip,
    "tis": _tis,
    "cispo": _cispo,
    "topr": _topr,
    "decoupled_ppo": _decoupled_ppo,
}


def _kl_estimate(estimator: str, logp: Tensor, ref: Tensor, valid: Tensor) -> Tensor:
    """Schulman's k1 or k3 estimate of KL(policy || reference) per token (0 where not valid), through logp."""
    log_rho = torch.where(valid, ref.detach().to(logp.dtype) - logp, 0.0).clamp(-20.0, 20.0)
    if estimator == "k1":
        return -log_rho
    if estimator == "k3":
        return torch.exp(log_rho) - 1.0 - log_rho
    raise ValueError(f"unknown kl_estimator {estimator!r}; expected k1 or k3")


def loss_denominator(mask: Tensor, aggregation: str) -> float:
    """What the loss of `mask`'s batch is divided by: masked tokens (token_mean) or non-empty sequences (seq_mean,
    token_sum_norm)."""
    valid = mask > 0
    if aggregation == "token_mean":
        return float(valid.sum().item())
    if aggregation in ("seq_mean", "token_sum_norm"):
        return float(valid.any(dim=1).sum().item())
    raise ValueError(f"unknown aggregation {aggregation!r}")


def batch_denominator(masks: Sequence[Sequence[int]], aggregation: str) -> float:
    """`loss_denominator` of a batch given as unpadded per-sequence loss masks."""
    if aggregation == "token_mean":
        return float(sum(map(sum, masks)))
    if aggregation in ("seq_mean", "token_sum_norm"):
        return float(sum(1 for m in masks if any(m)))
    raise ValueError(f"unknown aggregation {aggregation!r}")


def _aggregate(per_token: Tensor, valid: Tensor, cfg: LossConfig, denominator: float) -> Tensor:
    # where, not multiply: a masked position's value never reaches the sum, even if it is not finite.
    masked = torch.where(valid, per_token, 0.0)
    if cfg.aggregation == "token_mean":
        numerator = masked.sum()
    elif cfg.aggregation == "seq_mean":
        lengths = valid.sum(dim=1)
        numerator = (masked.sum(dim=1) / lengths.clamp(min=1)).sum()
    elif cfg.aggregation == "token_sum_norm":
        if cfg.norm_length is None:
            raise ValueError("aggregation token_sum_norm needs loss.norm_length (the longest generation, in tokens)")
        numerator = masked.sum() / cfg.norm_length
    else:
        raise ValueError(f"unknown aggregation {cfg.aggregation!r}")
    return numerator / (denominator if denominator > 0 else 1.0)


def _metrics(t: _Tokens, clipped: Tensor, weight: Tensor, extra: dict[str, Tensor]) -> dict[str, float]:
    """The module docstring's metrics; `extra` adds the masked mean of each named per-token tensor."""
    valid = t.valid
    if not bool(valid.any()):
        return dict.fromkeys((*METRIC_NAMES, *extra), 0.0)
    with torch.no_grad():
        diff = (t.logp.detach() - t.behaviour)[valid].double()
        r = t.ratio.detach()[valid].double()
        values = torch.stack(
            [
                (-diff).mean(),
                (r - 1.0 - diff).mean(),
                r.mean(),
                r.max(),
                r.min(),
                diff.abs().mean(),
                diff.abs().max(),
                clipped[valid].double().mean(),
                weight.detach()[valid].double().mean(),
                *(value.detach()[valid].double().mean() for value in extra.values()),
            ]
        ).tolist()
    return dict(zip((*METRIC_NAMES, *extra), values, strict=True))


def _check_shapes(logprobs: Tensor, advantages: Tensor, **aligned: Tensor | None) -> None:
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs {tuple(logprobs.shape)} must be [B, L]")
    for name, tensor in aligned.items():
        if tensor is not None and tensor.shape != logprobs.shape:
            raise ValueError(
                f"{name} {tuple(tensor.shape)} must be the same [B, L] shape as logprobs {tuple(logprobs.shape)}"
            )
    if advantages.shape not in (logprobs.shape[:1], logprobs.shape):
        raise ValueError(
            f"advantages {tuple(advantages.shape)} must be [B] = [{logprobs.shape[0]}] or [B, L] = "
            f"{list(logprobs.shape)}"
        )


def policy_loss(
    cfg: LossConfig,
    logprobs: Tensor,
    behaviour_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    prox_logprobs: Tensor | None = None,
    *,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    denominator: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The aggregated loss of a [B, L] batch (advantages [B], one a sequence, or [B, L], one a token) and its
    metrics; see the module docstring.

    `prox_logprobs`: the proximal policy's (decoupled_ppo needs them). `ref_logprobs`: the frozen reference's
    (needed when kl_coef > 0; logged as `kl_ref` whenever given). `entropy`: each token's entropy (needed, with
    its gradient, when entropy_coef > 0; logged as `entropy` whenever given). `denominator` None divides by this
    batch's own token/sequence count; pass `loss_denominator` of the whole batch when this is one micro-batch.
    """
    _check_shapes(
        logprobs,
        advantages,
        behaviour=behaviour_logprobs,
        mask=mask,
        prox_logprobs=prox_logprobs,
        ref_logprobs=ref_logprobs,
        entropy=entropy,
    )
    valid = mask > 0
    behaviour = behaviour_logprobs.detach().to(logprobs.dtype)
    ratio = torch.exp(torch.where(valid, logprobs - behaviour, 0.0))
    adv = advantages.detach().to(logprobs.dtype)
    adv = adv[:, None].expand_as(logprobs) if adv.dim() == 1 else adv
    tokens = _Tokens(logprobs, behaviour, ratio, adv, valid, prox_logprobs)
    per_token, clipped, weight = _LOSSES[cfg.kind](cfg, tokens)
    extra: dict[str, Tensor] = {}
    if ref_logprobs is not None:
        extra[KL_REF] = _kl_estimate(cfg.kl_estimator, logprobs, ref_logprobs, valid)
    elif cfg.kl_coef > 0:
        raise ValueError("kl_coef > 0 needs ref_logprobs (the frozen reference policy's logprobs)")
    if cfg.kl_coef > 0:
        per_token = per_token + cfg.kl_coef * extra[KL_REF]
    if entropy is not None:
        extra[ENTROPY] = entropy
        if cfg.entropy_coef > 0:
            per_token = per_token - cfg.entropy_coef * entropy.to(per_token.dtype)
    elif cfg.entropy_coef > 0:
        raise ValueError("entropy_coef > 0 needs the per-token entropy")
    if denominator is None:
        denominator = loss_denominator(mask, cfg.aggregation)
    loss = _aggregate(per_token, valid, cfg, denominator)
    return loss, _metrics(tokens, clipped, weight, extra)


def merge_metrics(parts: Sequence[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """Combine (masked tokens, metrics) of micro-batches: token-weighted means, max of `*_max`, min of `*_min`.
    Parts without tokens are ignored; no part with tokens gives all zeros (for every name any part has)."""
    names = list(dict.fromkeys(name for _, metrics in parts for name in metrics)) or list(METRIC_NAMES)
    counted = [(tokens, metrics) for tokens, metrics in parts if tokens > 0]
    if not counted:
        return dict.fromkeys(names, 0.0)
    total = sum(tokens for tokens, _ in counted)
    merged: dict[str, float] = {}
    for name in names:
        values = [metrics[name] for _, metrics in counted]
        if name in MAX_METRICS:
            merged[name] = max(values)
        elif name in MIN_METRICS:
            merged[name] = min(values)
        else:
            merged[name] = sum(tokens * metrics[name] for tokens, metrics in counted) / total
    return merged
