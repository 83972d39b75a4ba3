"""trajflow.rl.losses' terms beside the policy loss, on test_rl_losses.py's 2 x 3 example worked out by hand: the KL
penalty to a reference (k1, k3), the entropy bonus and metric, and Dr. GRPO's token_sum_norm aggregation.

With advantages 0 every policy loss is 0 with a zero gradient, so a term shows alone. The reference logprobs are
the example's behaviour logprobs, so on the five masked tokens log rho = ref - logp = [-.2, 0, 0, .2, -.2], and
the masked-out (0,2) (ref -1.0 against logp -2.0) would add a visible 1.0 if masking failed.
"""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from tests.unit.test_rl_losses import ADV, BEHAVIOUR, LOGP, MASK, E, grid
from trajflow.contracts.training import LossConfig, TrainingRunConfig
from trajflow.rl.losses import policy_loss

LOG_RHO = [-0.2, 0.0, 0.0, 0.2, -0.2]
ZERO_ADV = [0.0, 0.0]


def run_terms(
    cfg: LossConfig,
    *,
    adv: list[float] = ZERO_ADV,
    ref: list[list[float]] | None = BEHAVIOUR,
    entropy: list[list[float]] | None = None,
) -> tuple[float, list[list[float]], list[list[float]] | None, dict[str, float]]:
    """(loss, d loss / d logp, d loss / d entropy or None, metrics)."""
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    entropy_t = torch.tensor(entropy, dtype=torch.float64, requires_grad=True) if entropy is not None else None
    loss, metrics = policy_loss(
        cfg,
        logp,
        torch.tensor(BEHAVIOUR, dtype=torch.float64),
        torch.tensor(adv, dtype=torch.float64),
        torch.tensor(MASK, dtype=torch.float64),
        ref_logprobs=torch.tensor(ref, dtype=torch.float64) if ref is not None else None,
        entropy=entropy_t,
    )
    inputs = [logp] + ([entropy_t] if entropy_t is not None else [])
    grads = [
        g if g is not None else torch.zeros_like(x)
        for g, x in zip(torch.autograd.grad(loss, inputs, allow_unused=True), inputs, strict=True)
    ]
    return loss.item(), grads[0].tolist(), grads[1].tolist() if len(grads) > 1 else None, metrics


def test_k1_penalty_is_the_mean_log_ratio_with_a_unit_gradient() -> None:
    # k1 = -log rho = logp - ref = [.2, 0, 0, -.2, .2]: mean .04; loss 0.5 * .04; d/d logp = 0.5 per token / 5
    loss, grad, _, metrics = run_terms(LossConfig(kind="tis", kl_coef=0.5, kl_estimator="k1"))
    assert metrics["kl_ref"] == pytest.approx(0.2 / 5, abs=1e-12)
    assert loss == pytest.approx(0.5 * 0.2 / 5, abs=1e-12)
    assert grad == [pytest.approx(row, abs=1e-12) for row in grid([1.0] * 5, 0.5 / 5)]


def test_k3_penalty_is_rho_minus_one_minus_log_rho() -> None:
    # k3 = rho - 1 - log rho >= 0; d k3 / d logp = 1 - rho (log rho = ref - logp)
    k3 = [E(x) - 1 - x for x in LOG_RHO]
    loss, grad, _, metrics = run_terms(LossConfig(kind="cispo", kl_coef=2.0, kl_estimator="k3"))
    assert metrics["kl_ref"] == pytest.approx(sum(k3) / 5, abs=1e-12)
    assert loss == pytest.approx(2.0 * sum(k3) / 5, abs=1e-12)
    assert grad == [pytest.approx(row, abs=1e-12) for row in grid([1 - E(x) for x in LOG_RHO], 2.0 / 5)]


def test_the_penalty_adds_to_the_policy_loss_and_aggregates_like_it() -> None:
    # ppo_clip inside its trust region: per-token -r A (gradient -r A), plus 0.1 * k1 (gradient 0.1); seq_mean:
    # row 0 over its 2 tokens, row 1 over 3, then the mean of the two rows
    policy = [-E(0.2), -1.0, 2.0, 2 * E(-0.2), 2 * E(0.2)]
    per_token = [p + 0.1 * -x for p, x in zip(policy, LOG_RHO, strict=True)]
    cfg = LossConfig(kind="ppo_clip", aggregation="seq_mean", kl_coef=0.1, kl_estimator="k1")
    loss, grad, _, _ = run_terms(cfg, adv=ADV)
    assert loss == pytest.approx((sum(per_token[:2]) / 2 + sum(per_token[2:]) / 3) / 2, abs=1e-12)
    assert grad[0] == pytest.approx([(policy[0] + 0.1) / 4, (policy[1] + 0.1) / 4, 0.0], abs=1e-12)
    assert grad[1] == pytest.approx([(p + 0.1) / 6 for p in policy[2:]], abs=1e-12)


def test_kl_is_logged_without_a_penalty_and_a_penalty_needs_the_reference() -> None:
    loss, _, _, metrics = run_terms(LossConfig(kind="tis", kl_estimator="k1"))
    assert loss == 0.0 and metrics["kl_ref"] == pytest.approx(0.04)
    _, _, _, without = run_terms(LossConfig(kind="tis"), ref=None)
    assert "kl_ref" not in without
    with pytest.raises(ValueError, match="ref_logprobs"):
        run_terms(LossConfig(kind="tis", kl_coef=0.1), ref=None)


def test_a_far_off_reference_gives_a_finite_k3() -> None:
    far = [[-500.0] * 3, [-500.0] * 3]  # log rho ~ -499, clamped at -20: k3 = e^-20 - 1 + 20
    _, grad, _, metrics = run_terms(LossConfig(kind="tis", kl_coef=1.0), ref=far)
    assert metrics["kl_ref"] == pytest.approx(E(-20) - 1 + 20)
    assert all(g == 0.0 for row in grad for g in row)  # beyond the clamp the estimate is flat


ENTROPY = [[1.0, 2.0, 9.0], [0.5, 1.5, 1.0]]  # (0,2) is masked out


def test_entropy_is_logged_as_its_masked_mean_and_its_bonus_lowers_the_loss() -> None:
    loss, _, d_entropy, metrics = run_terms(LossConfig(kind="tis"), ref=None, entropy=ENTROPY)
    assert metrics["entropy"] == pytest.approx((1.0 + 2.0 + 0.5 + 1.5 + 1.0) / 5)
    assert loss == 0.0 and d_entropy == [[0.0] * 3, [0.0] * 3]  # no bonus: logged only
    loss, _, d_entropy, _ = run_terms(LossConfig(kind="tis", entropy_coef=0.01), ref=None, entropy=ENTROPY)
    assert loss == pytest.approx(-0.01 * 6.0 / 5, abs=1e-12)
    assert d_entropy == [pytest.approx(row, abs=1e-12) for row in grid([1.0] * 5, -0.01 / 5)]
    with pytest.raises(ValueError, match="entropy"):
        run_terms(LossConfig(kind="tis", entropy_coef=0.01), ref=None)


def test_token_sum_norm_divides_by_the_constant_not_each_length() -> None:
    # Dr. GRPO: each row's summed per-token loss / norm_length (4), then the mean over the 2 rows; the gradient of
    # every token is its own over 4 * 2, whatever its row's length (seq_mean would give row 0's tokens 1/4 and
    # row 1's 1/6)
    per_token = [-E(0.2), -1.0, 2.0, 2 * E(-0.2), 2 * E(0.2)]
    cfg = LossConfig(kind="ppo_clip", aggregation="token_sum_norm", norm_length=4)
    loss, grad, _, _ = run_terms(cfg, adv=ADV, ref=None)
    assert loss == pytest.approx((sum(per_token[:2]) / 4 + sum(per_token[2:]) / 4) / 2, abs=1e-12)
    assert grad == [pytest.approx(row, abs=1e-12) for row in grid(per_token, 1 / 8)]


def test_token_sum_norm_needs_its_constant() -> None:
    with pytest.raises(ValueError, match="norm_length"):
        run_terms(LossConfig(kind="ppo_clip", aggregation="token_sum_norm"), adv=ADV, ref=None)
    # a run config says which constant its tasks imply: 4 turns x 16 new tokens
    task = {"max_turns": 4, "sampling": {"max_new_tokens": 16}}
    with pytest.raises(ValidationError, match="at most 64 tokens"):
        TrainingRunConfig.model_validate({"tasks": [task], "trainer": {"loss": {"aggregation": "token_sum_norm"}}})
    run = {"tasks": [task], "trainer": {"loss": {"aggregation": "token_sum_norm", "norm_length": 64}}}
    assert TrainingRunConfig.model_validate(run).trainer.loss.norm_length == 64
