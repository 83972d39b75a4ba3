"""trajflow.rl.losses: each loss's value and gradient on a 2 x 3 example worked out by hand, with and without clipping;
aggregation modes, empty masks, micro-batch denominators and the metrics (the KL, entropy and Dr. GRPO terms:
test_rl_losses_terms.py, on the same example).

The example (row 0 has its last token masked out, with a logprob far from the behaviour's so a masking bug shows):
    logp      = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]]
    behaviour = [[-1.2, -0.5, -1.0], [-0.3, -1.0, -0.9]]
    mask      = [[1, 1, 0], [1, 1, 1]],  advantages = [1, -2]
so the ratios r = exp(logp - behaviour) on masked tokens are [[e^.2, 1], [1, e^-.2, e^.2]].
Expected values list the five masked tokens in order (0,0), (0,1), (1,0), (1,1), (1,2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch

from trajflow.contracts.training import LossConfig
from trajflow.rl.losses import batch_denominator, loss_denominator, merge_metrics, policy_loss

E = math.exp
LOGP = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]]
BEHAVIOUR = [[-1.2, -0.5, -1.0], [-0.3, -1.0, -0.9]]
MASK = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
ADV = [1.0, -2.0]
MASKED = [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]


def run(
    cfg: LossConfig,
    prox: list[list[float]] | None = None,
    adv: Sequence[float] = ADV,
    mask: list[list[float]] = MASK,
) -> tuple[float, list[list[float]], dict[str, float]]:
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    prox_t = torch.tensor(prox, dtype=torch.float64) if prox is not None else None
    loss, metrics = policy_loss(
        cfg,
        logp,
        torch.tensor(BEHAVIOUR, dtype=torch.float64),
        torch.tensor(list(adv), dtype=torch.float64),
        torch.tensor(mask, dtype=torch.float64),
        prox_t,
    )
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.item(), grad.tolist(), metrics


def grid(values: Sequence[float], scale: float) -> list[list[float]]:
    """Per-masked-token values placed in the 2 x 3 grid (masked-out tokens 0), each times `scale`."""
    out = [[0.0] * 3 for _ in range(2)]
    for (i, j), v in zip(MASKED, values, strict=True):
        out[i][j] = v * scale
    return out


def check(
    cfg: LossConfig,
    per_token: Sequence[float],
    grads: Sequence[float],
    clip_frac: float,
    prox: list[list[float]] | None = None,
    adv: Sequence[float] = ADV,
) -> dict[str, float]:
    """token_mean over the five masked tokens: loss = sum / 5, d loss / d logp = per-token gradient / 5."""
    loss, grad, metrics = run(cfg, prox, adv)
    assert loss == pytest.approx(sum(per_token) / 5, abs=1e-12)
    assert grad == [pytest.approx(row, abs=1e-12) for row in grid(grads, 1 / 5)]
    assert metrics["clip_frac"] == pytest.approx(clip_frac)
    return metrics


def test_ppo_clip_with_active_clipping() -> None:
    # bounds [0.9, 1.1]. (0,0): A > 0, r = e^.2 > 1.1 -> clipped: -1.1, no gradient. (1,1): A < 0, r = e^-.2 < 0.9
    # -> clipped: -(0.9 * -2) = 1.8, no gradient. (1,2): A < 0, r > 1.1 -> min picks r A = -2e^.2 (unclipped).
    # Unclipped tokens: loss -r A, gradient -r A.
    metrics = check(
        LossConfig(kind="ppo_clip", clip_low=0.1, clip_high=0.1),
        per_token=[-1.1, -1.0, 2.0, 1.8, 2 * E(0.2)],
        grads=[0.0, -1.0, 2.0, 0.0, 2 * E(0.2)],
        clip_frac=2 / 5,
    )
    assert metrics["is_weight_mean"] == pytest.approx((0 + 1 + 1 + 0 + E(0.2)) / 5)


def test_ppo_clip_inside_the_trust_region_is_the_plain_surrogate() -> None:
    # default bounds [0.8, 1.28] contain every ratio (e^-.2 = 0.819, e^.2 = 1.221): loss -r A, gradient -r A.
    expected = [-E(0.2), -1.0, 2.0, 2 * E(-0.2), 2 * E(0.2)]
    metrics = check(LossConfig(kind="ppo_clip"), per_token=expected, grads=expected, clip_frac=0.0)
    assert metrics["is_weight_mean"] == pytest.approx((E(0.2) + 1 + 1 + E(-0.2) + E(0.2)) / 5)


def test_tis_truncates_the_weight_at_the_cap() -> None:
    # w = min(r, 1.1) = [1.1, 1, 1, e^-.2, 1.1]; loss -w A logp; gradient -w A
    w = [1.1, 1.0, 1.0, E(-0.2), 1.1]
    metrics = check(
        LossConfig(kind="tis", tis_cap=1.1),
        per_token=[-1.1 * 1 * -1.0, -1.0 * 1 * -0.5, -1.0 * -2 * -0.3, -w[3] * -2 * -1.2, -1.1 * -2 * -0.7],
        grads=[-1.1, -1.0, 2.0, 2 * E(-0.2), 2.2],
        clip_frac=2 / 5,
    )
    assert metrics["is_weight_mean"] == pytest.approx(sum(w) / 5)


def test_tis_below_the_cap_is_importance_weighted_reinforce() -> None:
    r = [E(0.2), 1.0, 1.0, E(-0.2), E(0.2)]
    check(
        LossConfig(kind="tis", tis_cap=2.0),
        per_token=[-r[0] * -1.0, -r[1] * -0.5, -r[2] * -2 * -0.3, -r[3] * -2 * -1.2, -r[4] * -2 * -0.7],
        grads=[-r[0], -r[1], 2 * r[2], 2 * r[3], 2 * r[4]],
        clip_frac=0.0,
    )


def test_cispo_clips_the_weight_but_keeps_every_gradient() -> None:
    # w = clip(r, 0.9, 1.1) = [1.1, 1, 1, 0.9, 1.1]: unlike PPO, the clipped tokens (0,0), (1,1), (1,2) still
    # get a gradient -w A.
    check(
        LossConfig(kind="cispo", clip_low=0.1, clip_high=0.1),
        per_token=[1.1, 0.5, -0.6, -0.9 * 2 * 1.2, -1.1 * 2 * 0.7],
        grads=[-1.1, -1.0, 2.0, 1.8, 2.2],
        clip_frac=3 / 5,
    )


def test_cispo_inside_the_bounds_weights_by_the_ratio() -> None:
    r = [E(0.2), 1.0, 1.0, E(-0.2), E(0.2)]
    check(
        LossConfig(kind="cispo"),
        per_token=[r[0] * 1.0, r[1] * 0.5, -r[2] * 0.6, -r[3] * 2.4, -r[4] * 1.4],
        grads=[-r[0], -r[1], 2 * r[2], 2 * r[3], 2 * r[4]],
        clip_frac=0.0,
    )


def test_topr_weighs_by_the_sequence_ratio_not_the_token_ratios() -> None:
    # row 0 (A = 1): plain REINFORCE, w = 1 although r(0,0) = e^.2 > 1. Row 1 (A = -2): its token ratios are
    # [1, e^-.2, e^.2] but the sequence ratio is their product, e^(0 - .2 + .2) = 1, so w = clip(1, 0, 1) = 1 on
    # every token: nothing is truncated (a per-token TOPR would weigh (1,1) by e^-.2 and truncate (1,2)).
    check(
        LossConfig(kind="topr"),
        per_token=[1.0, 0.5, 2 * -0.3, 2 * -1.2, 2 * -0.7],
        grads=[-1.0, -1.0, 2.0, 2.0, 2.0],
        clip_frac=0.0,
    )


def test_topr_clips_each_negative_sequence_ratio_to_one() -> None:
    # advantages [-1, -2], the last token of both rows masked out. Row 0: log R = .2 + 0 = .2 (the masked (0,2),
    # whose log-ratio is -1, must not count), R = e^.2 -> w = 1, truncated. Row 1: log R = 0 - .2, w = e^-.2.
    # loss -w A logp; gradient -w A; token_mean over the four masked tokens.
    w = [1.0, 1.0, E(-0.2), E(-0.2)]
    mask = [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]
    loss, grad, metrics = run(LossConfig(kind="topr"), adv=[-1.0, -2.0], mask=mask)
    assert loss == pytest.approx((-1.0 - 0.5 - 0.6 * w[2] - 2.4 * w[3]) / 4, abs=1e-12)
    assert grad == [pytest.approx([0.25, 0.25, 0.0]), pytest.approx([2 * w[2] / 4, 2 * w[3] / 4, 0.0])]
    assert metrics["clip_frac"] == pytest.approx(2 / 4)
    assert metrics["is_weight_mean"] == pytest.approx(sum(w) / 4)


def test_topr_with_positive_advantages_is_plain_reinforce() -> None:
    # advantages [1, 2]: every weight is 1, whatever the ratio
    check(
        LossConfig(kind="topr"),
        per_token=[1.0, 0.5, 2 * 0.3, 2 * 1.2, 2 * 0.7],
        grads=[-1.0, -1.0, -2.0, -2.0, -2.0],
        clip_frac=0.0,
        adv=[1.0, 2.0],
    )


PROX = [[-1.1, -0.5, -2.0], [-0.3, -1.1, -0.8]]


def test_decoupled_ppo_clips_against_prox_and_caps_the_behaviour_weight() -> None:
    # w = min(exp(prox - behaviour), 1.1) = [min(e^.1, 1.1) = 1.1, 1, 1, e^-.1, min(e^.1, 1.1) = 1.1]
    # r' = exp(logp - prox) = [e^.1, 1, 1, e^-.1, e^.1]; bounds [0.9, 1.1]
    # (0,0): A > 0, r' = 1.105 > 1.1 -> clipped: -w * 1.1 = -1.21, no gradient
    # (1,1): A < 0, r' = 0.905 >= 0.9 -> unclipped: -w r' A = 2e^-.2
    # (1,2): A < 0, r' > 1.1 -> min picks r' A: -1.1 * e^.1 * -2 = 2.2e^.1
    # gradient of unclipped tokens: -w r' A
    check(
        LossConfig(kind="decoupled_ppo", clip_low=0.1, clip_high=0.1, tis_cap=1.1),
        per_token=[-1.21, -1.0, 2.0, 2 * E(-0.2), 2.2 * E(0.1)],
        grads=[0.0, -1.0, 2.0, 2 * E(-0.2), 2.2 * E(0.1)],
        clip_frac=2 / 5,  # (0,0) clipped and capped, (1,2) capped
        prox=PROX,
    )


def test_decoupled_ppo_at_the_proximal_policy_is_importance_weighted_reinforce() -> None:
    # prox = logp (one step per batch): r' = 1, loss -w A, gradient -w A with w = r (no cap reached)
    r = [E(0.2), 1.0, 1.0, E(-0.2), E(0.2)]
    check(
        LossConfig(kind="decoupled_ppo", tis_cap=2.0),
        per_token=[-r[0], -r[1], 2 * r[2], 2 * r[3], 2 * r[4]],
        grads=[-r[0], -r[1], 2 * r[2], 2 * r[3], 2 * r[4]],
        clip_frac=0.0,
        prox=LOGP,
    )


def test_decoupled_ppo_needs_prox() -> None:
    with pytest.raises(ValueError, match="prox_logprobs"):
        run(LossConfig(kind="decoupled_ppo"))


def test_seq_mean_averages_each_sequence_first() -> None:
    # the unclipped ppo example: row 0 mean over 2 tokens, row 1 over 3, then the mean of the two
    per_token = [-E(0.2), -1.0, 2.0, 2 * E(-0.2), 2 * E(0.2)]
    loss, grad, _ = run(LossConfig(kind="ppo_clip", aggregation="seq_mean"))
    assert loss == pytest.approx((sum(per_token[:2]) / 2 + sum(per_token[2:]) / 3) / 2)
    assert grad[0] == pytest.approx([per_token[0] / 4, per_token[1] / 4, 0.0])
    assert grad[1] == pytest.approx([v / 6 for v in per_token[2:]])
    token_loss, _, _ = run(LossConfig(kind="ppo_clip", aggregation="token_mean"))
    assert token_loss == pytest.approx(sum(per_token) / 5)
    assert token_loss != pytest.approx(loss)


def test_seq_mean_skips_sequences_without_generated_tokens() -> None:
    loss, _, _ = run(LossConfig(kind="ppo_clip", aggregation="seq_mean"), mask=[[0, 0, 0], [1, 1, 1]])
    assert loss == pytest.approx((2.0 + 2 * E(-0.2) + 2 * E(0.2)) / 3)  # not halved by the empty row


@pytest.mark.parametrize("kind", ["ppo_clip", "tis", "cispo", "topr", "decoupled_ppo"])
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean", "token_sum_norm"])
def test_an_all_empty_mask_gives_a_zero_loss_that_backpropagates(kind: str, aggregation: str) -> None:
    empty = [[0.0] * 3, [0.0] * 3]
    cfg = LossConfig(kind=kind, aggregation=aggregation, norm_length=4)  # type: ignore[arg-type]
    loss, grad, metrics = run(cfg, prox=PROX, mask=empty)
    assert loss == 0.0
    assert grad == [[0.0] * 3, [0.0] * 3]
    assert set(metrics.values()) == {0.0}


def test_metrics_cover_masked_tokens_only() -> None:
    _, _, m = run(LossConfig(kind="ppo_clip"))
    # behaviour - logp on masked tokens: [-0.2, 0, 0, 0.2, -0.2]; the masked-out (0,2) would add 1.0
    assert m["kl_rollout_trainer"] == pytest.approx(-0.2 / 5)
    k3 = [E(0.2) - 1 - 0.2, 0.0, 0.0, E(-0.2) - 1 + 0.2, E(0.2) - 1 - 0.2]
    assert m["kl_rollout_trainer_k3"] == pytest.approx(sum(k3) / 5)
    assert m["ratio_max"] == pytest.approx(E(0.2))
    assert m["ratio_min"] == pytest.approx(E(-0.2))
    assert m["ratio_mean"] == pytest.approx((2 * E(0.2) + 2 + E(-0.2)) / 5)
    assert m["logprob_abs_diff_max"] == pytest.approx(0.2)
    assert m["logprob_abs_diff_mean"] == pytest.approx(0.6 / 5)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean", "token_sum_norm"])
def test_micro_batches_with_the_whole_batch_denominator_sum_to_the_whole(aggregation: str) -> None:
    cfg = LossConfig(kind="ppo_clip", clip_low=0.1, clip_high=0.1, aggregation=aggregation, norm_length=4)  # type: ignore[arg-type]
    full, full_grad, _ = run(cfg)
    denominator = loss_denominator(torch.tensor(MASK), aggregation)
    assert denominator == (5.0 if aggregation == "token_mean" else 2.0)
    assert batch_denominator([[int(m) for m in row] for row in MASK], aggregation) == denominator
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    total = torch.zeros((), dtype=torch.float64)
    for row in (0, 1):
        part, _ = policy_loss(
            cfg,
            logp[row : row + 1],
            torch.tensor(BEHAVIOUR[row : row + 1], dtype=torch.float64),
            torch.tensor(ADV[row : row + 1], dtype=torch.float64),
            torch.tensor(MASK[row : row + 1], dtype=torch.float64),
            denominator=denominator,
        )
        total = total + part
    (grad,) = torch.autograd.grad(total, logp)
    assert total.item() == pytest.approx(full)
    assert grad.tolist() == [pytest.approx(row) for row in full_grad]


def test_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(LossConfig(), torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="same"):
        policy_loss(LossConfig(), torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3))


def test_merge_metrics_weights_by_tokens_and_keeps_extremes() -> None:
    a = {"ratio_mean": 1.0, "ratio_max": 2.0, "ratio_min": 0.5, "clip_frac": 0.0}
    b = {"ratio_mean": 4.0, "ratio_max": 3.0, "ratio_min": 0.9, "clip_frac": 1.0}
    merged = merge_metrics([(3.0, a), (1.0, b), (0.0, {k: 99.0 for k in a})])
    assert merged == {"ratio_mean": (3 * 1 + 4) / 4, "ratio_max": 3.0, "ratio_min": 0.5, "clip_frac": 0.25}
