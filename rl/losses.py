"""Token-level policy-gradient losses with off-policy corrections, and their diagnostics.

Every loss sees, per generated token t of sequence i: the trainer's logprob `logp` (carries grad), the rollout
(behaviour) policy's logprob `b` recorded by the decode worker, the sequence's advantage `A_i`, and a loss mask.
The ratio is r = exp(logp - b). `sg` is stop-gradient. Per-token losses:

- `ppo_clip`: -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A). The clipped surrogate of PPO (Schulman et al.
  2017, "Proximal Policy Optimization Algorithms") as GRPO uses it with group advantages (Shao et al. 2024,
  "DeepSeekMath"); `clip_high > clip_low` is DAPO's clip-higher (Yu et al. 2025).
- `tis`: -sg(min(r, tis_cap)) A logp. REINFORCE with a truncated importance weight, correcting the mismatch
  between the inference engine and the trainer (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings
  You Off-Policy RL Training").
- `cispo`: -sg(clip(r, 1 - clip_low, 1 + clip_high)) A logp. Clipped IS-weight policy optimisation (MiniMax
  2025, "MiniMax-M1"): the weight is clipped, but unlike PPO no token's gradient is dropped.
- `topr`: -A logp when A >= 0, -sg(clip(r, 0, 1)) A logp when A < 0. Tapered off-policy REINFORCE (Le Roux et
  al. 2025, "Tapered Off-Policy REINFORCE").
- `decoupled_ppo`: -w min(r' A, clip(r', 1 - clip_low, 1 + clip_high) A) with r' = exp(logp - prox) against the
  trainer's own pre-update (proximal) logprobs and w = sg(min(exp(prox - b), tis_cap)). Decoupled PPO (Hilton et
  al. 2021, "Batch Size-Invariance for Policy Optimization"), as AReaL uses it for asynchronous RL (Fu et al.
  2025), with the behaviour weight capped as in TIS.

Aggregation: `token_mean` = sum of masked per-token losses / number of masked tokens; `seq_mean` = mean over
sequences with at least one masked token of each sequence's masked mean. A batch with no masked token gives a
loss of exactly 0 that still back-propagates (zero gradients, no NaN). `denominator` lets a caller that splits a
batch into micro-batches divide every part by the whole batch's token or sequence count (`loss_denominator`),
so the parts' losses and gradients sum to the whole batch's.

Metrics (floats, over masked tokens; all 0.0 when there are none): `kl_rollout_trainer` (k1 estimate of
KL(rollout || trainer): mean of b - logp), `kl_rollout_trainer_k3` (mean of r - 1 - log r, Schulman's k3),
`ratio_mean/max/min` (of r), `logprob_abs_diff_mean/max` (|logp - b|), `clip_frac` (fraction of tokens where the
chosen loss clipped or truncated something; for decoupled_ppo either the PPO clip on r' or the cap on w),
`is_weight_mean` (the weight w_t the token's gradient actually gets, d loss_t / d logp_t = -w_t A: r or 0 for
ppo_clip, the truncated/clipped weight for tis/cispo/topr, w r' or 0 for decoupled_ppo). `merge_metrics`
combines micro-batches: token-weighted means, max of maxima, min of minima.

Limits: no entropy bonus, no KL-to-reference penalty, no sequence-level (GSPO-style) ratios; advantages are one
scalar per sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from contracts.training import LossConfig

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

Tensor = torch.Tensor
_PerToken = tuple[Tensor, Tensor, Tensor]
"""(per-token loss, clipped/truncated flag, gradient weight), each [B, L]."""


@dataclass(frozen=True)
class _Tokens:
    """One batch's per-token inputs, all [B, L]: `adv` is broadcast, `ratio` = exp(logp - behaviour) on `valid`."""

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
    r = t.ratio.detach()
    negative = t.adv < 0
    weight = torch.where(negative, r.clamp(0.0, 1.0), torch.ones_like(r))
    return -weight * t.adv * t.logp, negative & (r > 1.0), weight


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


def loss_denominator(mask: Tensor, aggregation: str) -> float:
    """What the loss of `mask`'s batch is divided by: masked tokens (token_mean) or non-empty sequences (seq_mean)."""
    valid = mask > 0
    if aggregation == "token_mean":
        return float(valid.sum().item())
    if aggregation == "seq_mean":
        return float(valid.any(dim=1).sum().item())
    raise ValueError(f"unknown aggregation {aggregation!r}")


def _aggregate(per_token: Tensor, valid: Tensor, aggregation: str, denominator: float) -> Tensor:
    # where, not multiply: a masked position's value never reaches the sum, even if it is not finite.
    masked = torch.where(valid, per_token, 0.0)
    if aggregation == "token_mean":
        numerator = masked.sum()
    elif aggregation == "seq_mean":
        lengths = valid.sum(dim=1)
        numerator = (masked.sum(dim=1) / lengths.clamp(min=1)).sum()
    else:
        raise ValueError(f"unknown aggregation {aggregation!r}")
    return numerator / (denominator if denominator > 0 else 1.0)


def _metrics(t: _Tokens, clipped: Tensor, weight: Tensor) -> dict[str, float]:
    valid = t.valid
    if not bool(valid.any()):
        return dict.fromkeys(METRIC_NAMES, 0.0)
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
            ]
        ).tolist()
    return dict(zip(METRIC_NAMES, values, strict=True))


def policy_loss(
    cfg: LossConfig,
    logprobs: Tensor,
    behaviour_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    prox_logprobs: Tensor | None = None,
    *,
    denominator: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The aggregated loss of a [B, L] batch (advantages [B]) and its metrics; see the module docstring.

    `denominator` None divides by this batch's own token/sequence count; pass `loss_denominator` of the whole
    batch when this is one micro-batch of it.
    """
    if logprobs.shape != behaviour_logprobs.shape or logprobs.shape != mask.shape or logprobs.dim() != 2:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, behaviour {tuple(behaviour_logprobs.shape)} and mask "
            f"{tuple(mask.shape)} must be the same [B, L] shape"
        )
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages {tuple(advantages.shape)} must be [B] = [{logprobs.shape[0]}]")
    if prox_logprobs is not None and prox_logprobs.shape != logprobs.shape:
        raise ValueError(f"prox_logprobs {tuple(prox_logprobs.shape)} must match logprobs {tuple(logprobs.shape)}")
    valid = mask > 0
    behaviour = behaviour_logprobs.detach().to(logprobs.dtype)
    ratio = torch.exp(torch.where(valid, logprobs - behaviour, 0.0))
    adv = advantages.detach().to(logprobs.dtype)[:, None].expand_as(logprobs)
    tokens = _Tokens(logprobs, behaviour, ratio, adv, valid, prox_logprobs)
    per_token, clipped, weight = _LOSSES[cfg.kind](cfg, tokens)
    if denominator is None:
        denominator = loss_denominator(mask, cfg.aggregation)
    loss = _aggregate(per_token, valid, cfg.aggregation, denominator)
    return loss, _metrics(tokens, clipped, weight)


def merge_metrics(parts: Sequence[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """Combine (masked tokens, metrics) of micro-batches: token-weighted means, max of `*_max`, min of `*_min`.
    Parts without tokens are ignored; no part with tokens gives all zeros."""
    counted = [(tokens, metrics) for tokens, metrics in parts if tokens > 0]
    if not counted:
        return dict.fromkeys(METRIC_NAMES, 0.0)
    total = sum(tokens for tokens, _ in counted)
    merged: dict[str, float] = {}
    for name in counted[0][1]:
        values = [metrics[name] for _, metrics in counted]
        if name in MAX_METRICS:
            merged[name] = max(values)
        elif name in MIN_METRICS:
            merged[name] = min(values)
        else:
            merged[name] = sum(tokens * metrics[name] for tokens, metrics in counted) / total
    return merged
