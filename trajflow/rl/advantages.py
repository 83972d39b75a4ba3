"""Group-relative advantages: one scalar per trajectory, relative to the other samples of its prompt.

- GRPO (Shao et al. 2024, DeepSeekMath): A_i = (r_i - mean(r)) / (std(r) + eps), with the population std.
- Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): A_i = r_i - mean(r), no std division,
  which removes the bias towards groups with little spread.

A group of one sample, or one whose rewards are all equal, carries no learning signal: its advantages are exactly
zero (not eps-divided rounding noise). Every token of a trajectory gets its trajectory's advantage; that
broadcast happens in the loss, not here. Per-turn credit (one advantage per turn, `trajflow.rl.credit`) builds on
these.

Limits: no batch-level normalisation and no reward shaping (length penalties, KL-in-reward); rewards must be finite.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from trajflow.contracts.steps import is_flat


def group_advantages(rewards: Sequence[float], *, normalize_std: bool = True, eps: float = 1e-6) -> list[float]:
    """Advantages of one group's rewards, in the same order (see the module docstring)."""
    values = [float(r) for r in rewards]
    if any(not math.isfinite(r) for r in values):
        raise ValueError(f"rewards must be finite, got {values}")
    if is_flat(values):
        return [0.0] * len(values)
    mean = sum(values) / len(values)
    centred = [r - mean for r in values]
    if not normalize_std:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / len(values))
    return [c / (std + eps) for c in centred]


def advantages_by_group(
    groups: Mapping[str, Sequence[float]], *, normalize_std: bool = True, eps: float = 1e-6
) -> dict[str, list[float]]:
    """`group_advantages` of every group: group id -> advantages in the order of that group's rewards."""
    return {group: group_advantages(rewards, normalize_std=normalize_std, eps=eps) for group, rewards in groups.items()}
