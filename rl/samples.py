"""Training samples: one scored trajectory becomes one `TrainSample` (all its turns in one sequence, prompt and
observation tokens masked out of the loss) with its group-relative advantage.

`samples_from_records` is the one path from stored `TrajectoryRecord`s to samples: the trainer activity loads
the records and calls it. Advantages come from `rl.advantages.group_advantages`, per group.

Limits: no reward shaping, no batch-level advantage normalisation; unscored trajectories are refused, never
trained on.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from contracts.records import TrajectoryRecord
from contracts.trajectory import TrajectoryStatus
from rl.advantages import group_advantages


@dataclass
class TrainSample:
    """One training sequence: aligned token ids, behaviour logprobs (0.0 where not generated) and loss mask."""

    token_ids: list[int]
    behaviour_logprobs: list[float]
    loss_mask: list[int]
    advantage: float
    version: int = 0
    """The policy version that generated it (the oldest of its turns)."""
    temperature: float = 1.0
    """The sampling temperature its behaviour logprobs were computed at (greedy decoding records T = 1)."""

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.behaviour_logprobs) != n or len(self.loss_mask) != n:
            raise ValueError(
                f"token_ids ({n}), behaviour_logprobs ({len(self.behaviour_logprobs)}) and loss_mask "
                f"({len(self.loss_mask)}) must be aligned"
            )
        if n == 0:
            raise ValueError("a training sample needs at least one token")
        if self.loss_mask[0]:
            raise ValueError("the first token has no logprob (nothing precedes it): its loss mask must be 0")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask holds 0 or 1 only")
        if not math.isfinite(self.advantage) or self.temperature <= 0:
            raise ValueError(f"advantage must be finite and temperature > 0, got {self.advantage}, {self.temperature}")


def samples_from_records(records: Sequence[TrajectoryRecord], *, normalize_std: bool) -> list[TrainSample]:
    """TrainSamples in the records' order, advantages relative to each `request.group` (every record with the
    same group id, "" included, is one group). A record that is not completed, has no reward or has no token
    context raises ValueError: unscored trajectories are never trained on."""
    by_group: dict[str, list[int]] = defaultdict(list)
    for index, record in enumerate(records):
        if record.status != TrajectoryStatus.COMPLETED or record.reward is None:
            raise ValueError(
                f"trajectory {record.workflow_id} is {record.status.value} with reward {record.reward}: only "
                "completed, scored trajectories are trained on"
            )
        if record.context is None or not record.context.token_ids:
            raise ValueError(f"trajectory {record.workflow_id} has no token context; nothing to train on")
        by_group[record.request.group].append(index)
    advantages = [0.0] * len(records)
    for indices in by_group.values():
        rewards = [float(records[i].reward or 0.0) for i in indices]
        for i, adv in zip(indices, group_advantages(rewards, normalize_std=normalize_std), strict=True):
            advantages[i] = adv
    samples = []
    for record, adv in zip(records, advantages, strict=True):
        ctx = record.context
        assert ctx is not None  # checked above
        temperature = record.request.sampling.temperature
        samples.append(
            TrainSample(
                token_ids=list(ctx.token_ids),
                behaviour_logprobs=list(ctx.logprobs),
                loss_mask=list(ctx.loss_mask),
                advantage=adv,
                version=min(ctx.turn_versions, default=0),
                temperature=temperature if temperature > 0 else 1.0,
            )
        )
    return samples
