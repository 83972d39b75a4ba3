"""trajflow.rl.losses with per-token advantages [B, L] (per-turn credit): every loss kind and aggregation gives the
[B] path's loss, gradient and metrics when each row's tokens share one advantage, and uses each token's own
otherwise (worked out by hand on test_rl_losses.py's 2 x 3 example)."""

from __future__ import annotations

import math
from typing import get_args

import pytest
import torch

from trajflow.contracts.training import LossConfig, LossKind
from trajflow.rl.losses import policy_loss

E = math.exp
LOGP = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]]
BEHAVIOUR = [[-1.2, -0.5, -1.0], [-0.3, -1.0, -0.9]]
PROX = [[-1.1, -0.5, -2.0], [-0.3, -1.1, -0.8]]
REF = [[-0.9, -0.6, -1.5], [-0.4, -1.1, -0.6]]
ENTROPY = [[0.5, 0.7, 0.9], [1.1, 0.3, 0.2]]
MASK = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]


def run(cfg: LossConfig, adv: list[float] | list[list[float]], mask: list[list[float]] = MASK):
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    entropy = torch.tensor(ENTROPY, dtype=torch.float64)
    loss, metrics = policy_loss(
        cfg,
        logp,
        torch.tensor(BEHAVIOUR, dtype=torch.float64),
        torch.tensor(adv, dtype=torch.float64),
        torch.tensor(mask, dtype=torch.float64),
        torch.tensor(PROX, dtype=torch.float64),
        ref_logprobs=torch.tensor(REF, dtype=torch.float64),
        entropy=entropy,
    )
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.item(), grad.tolist(), metrics


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean", "token_sum_norm"])
@pytest.mark.parametrize("kind", get_args(LossKind))
def test_a_row_of_equal_token_advantages_is_the_sequence_advantage(kind: str, aggregation: str) -> None:
    # clip bounds tight enough that ppo/cispo/tis/decoupled_ppo clip some tokens; KL and entropy terms on
    cfg = LossConfig(
        kind=kind,  # type: ignore[arg-type]
        aggregation=aggregation,  # type: ignore[arg-type]
        norm_length=7,
        clip_low=0.1,
        clip_high=0.1,
        tis_cap=1.1,
        kl_coef=0.1,
        entropy_coef=0.01,
    )
    for adv in ([1.0, -2.0], [-1.0, -2.0], [0.5, 0.0]):
        per_row = run(cfg, adv)
        per_token = run(cfg, [[a] * 3 for a in adv])
        assert per_token[0] == pytest.approx(per_row[0], abs=1e-12)
        assert per_token[1] == [pytest.approx(row, abs=1e-12) for row in per_row[1]]
        assert per_token[2] == pytest.approx(per_row[2], abs=1e-12)


def test_tis_weighs_each_token_by_its_own_advantage() -> None:
    # tis with cap 10 (nothing truncated): loss_t = -r_t A_t logp_t, gradient -r_t A_t; token_mean over 5 tokens.
    # The masked-out (0, 2) has advantage 100: it must not count. r = [[e^.2, 1, -], [1, e^-.2, e^.2]].
    adv = [[1.0, -1.0, 100.0], [2.0, 0.0, -3.0]]
    loss, grad, _ = run(LossConfig(kind="tis", tis_cap=10.0), adv)
    r = [[E(0.2), 1.0, 0.0], [1.0, E(-0.2), E(0.2)]]
    tokens = [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    assert loss == pytest.approx(sum(-r[i][j] * adv[i][j] * LOGP[i][j] for i, j in tokens) / 5, abs=1e-12)
    expected = [[-r[i][j] * adv[i][j] / 5 if (i, j) in tokens else 0.0 for j in range(3)] for i in range(2)]
    assert grad == [pytest.approx(row, abs=1e-12) for row in expected]


def test_topr_takes_its_branch_token_by_token() -> None:
    # Last column masked out. Row 0: log R = .2 + 0 = .2, R = e^.2; row 1: log R = 0 - .2, R = e^-.2.
    # Negative tokens get w = clip(R, 0, 1): (0,0) -> 1 (truncated), (1,0) -> e^-.2; positive tokens w = 1.
    # gradient -w A / 4 (token_mean over four tokens).
    mask = [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]
    adv = [[-1.0, 1.0, 0.0], [-2.0, 2.0, 0.0]]
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    loss, metrics = policy_loss(
        LossConfig(kind="topr"),
        logp,
        torch.tensor(BEHAVIOUR, dtype=torch.float64),
        torch.tensor(adv, dtype=torch.float64),
        torch.tensor(mask, dtype=torch.float64),
    )
    (grad,) = torch.autograd.grad(loss, logp)
    assert grad.tolist() == [pytest.approx([0.25, -0.25, 0.0]), pytest.approx([2 * E(-0.2) / 4, -0.5, 0.0])]
    assert metrics["clip_frac"] == pytest.approx(1 / 4)
    assert loss.item() == pytest.approx((-1.0 * 1 + 0.5 - 2 * 0.3 * E(-0.2) + 2 * 1.2) / 4, abs=1e-12)


def test_advantages_must_be_b_or_b_by_l() -> None:
    with pytest.raises(ValueError, match=r"\[B\] = \[2\] or \[B, L\]"):
        policy_loss(LossConfig(), torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
