"""trajflow.rl.advantages: GRPO and Dr. GRPO group advantages against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from trajflow.rl.advantages import advantages_by_group, group_advantages


def test_grpo_divides_by_the_population_std() -> None:
    # rewards 1, 0, 0, 1: mean 0.5, population std sqrt((4 * 0.25) / 4) = 0.5
    adv = group_advantages([1.0, 0.0, 0.0, 1.0], eps=0.0)
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0])


def test_grpo_with_uneven_rewards() -> None:
    # rewards 3, 1, 2: mean 2, population std sqrt((1 + 1 + 0) / 3)
    std = math.sqrt(2 / 3)
    adv = group_advantages([3.0, 1.0, 2.0], eps=1e-6)
    assert adv == pytest.approx([1 / (std + 1e-6), -1 / (std + 1e-6), 0.0], abs=1e-12)


def test_dr_grpo_only_centres() -> None:
    assert group_advantages([3.0, 1.0, 2.0], normalize_std=False) == pytest.approx([1.0, -1.0, 0.0])


@pytest.mark.parametrize("rewards", [[0.1, 0.1, 0.1], [0.7], []])
@pytest.mark.parametrize("normalize_std", [True, False])
def test_a_group_without_spread_gets_exact_zeros(rewards: list[float], normalize_std: bool) -> None:
    # 0.1 * 3 / 3 != 0.1 in floating point: without the explicit check this would be rounding noise / eps
    assert group_advantages(rewards, normalize_std=normalize_std) == [0.0] * len(rewards)


def test_non_finite_rewards_are_rejected() -> None:
    with pytest.raises(ValueError, match="finite"):
        group_advantages([1.0, math.nan])


def test_advantages_by_group_keeps_groups_apart() -> None:
    out = advantages_by_group({"a": [1.0, 0.0], "b": [5.0, 5.0]}, normalize_std=False)
    assert out == {"a": [0.5, -0.5], "b": [0.0, 0.0]}
