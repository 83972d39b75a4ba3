"""Training samples: one scored trajectory becomes one `TrainSample` (all its turns in one sequence, prompt and
observation tokens masked out of the loss) with its group-relative advantage, and with per-turn credit one
advantage per token.

`samples_from_records` is the one path from stored `TrajectoryRecord`s to samples: the trainer activity loads
a step's records and calls it with the step's refs (the groups, rewards and versions the training workflow
recorded). Advantages come from `trajflow.rl.advantages.group_advantages`, per group; with a `CreditConfig` mode
other than `trajectory`, each turn's advantage comes from `trajflow.rl.credit` and is written on the tokens of that
turn's completion span (`TurnContext.turn_spans`, the tokens the loss mask marks), as `token_advantages`.

Limits: no reward shaping, no batch-level advantage normalisation; unscored trajectories are refused, never
trained on.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.training import CreditConfig, TrainRef
from trajflow.contracts.trajectory import TrajectoryStatus
from trajflow.rl import credit as turn_credit
from trajflow.rl.advantages import group_advantages


@dataclass
class TrainSample:
    """One training sequence: aligned token ids, behaviour logprobs (0.0 where not generated) and loss mask."""

    token_ids: list[int]
    behaviour_logprobs: list[float]
    loss_mask: list[int]
    advantage: float
    """The trajectory's group-relative advantage: every generated token's, unless `token_advantages` is set."""
    version: int = 0
    """The policy version that generated it (the oldest of its turns)."""
    temperature: float = 1.0
    """The sampling temperature its behaviour logprobs were computed at (greedy decoding records T = 1)."""
    token_advantages: list[float] | None = None
    """Per-turn credit: each token's advantage, aligned with token_ids (0.0 where the loss mask is 0); None: every
    token has `advantage`."""

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
        if self.token_advantages is not None:
            if len(self.token_advantages) != n:
                raise ValueError(f"token_advantages ({len(self.token_advantages)}) must be aligned with {n} tokens")
            if not all(map(math.isfinite, self.token_advantages)):
                raise ValueError("token_advantages must be finite")


@dataclass(frozen=True)
class _Score:
    """What a sample's advantage is computed from: its group, its reward, the version that generated it."""

    group: str
    reward: float
    version: int


def _scores(records: Sequence[TrajectoryRecord], refs: Sequence[TrainRef] | None) -> list[_Score]:
    """Each record's score: from its step ref (the training workflow's view, authoritative) when given, else
    from the record itself. Raises ValueError for unscored or token-less trajectories."""
    if refs is not None and len(refs) != len(records):
        raise ValueError(f"{len(records)} records but {len(refs)} refs: they must be aligned")
    scores = []
    for index, record in enumerate(records):
        ref = refs[index] if refs is not None else None
        if ref is not None and ref.workflow_id != record.workflow_id:
            raise ValueError(f"ref {index} names {ref.workflow_id} but its record is {record.workflow_id}")
        reward = ref.reward if ref is not None else record.reward
        if record.status != TrajectoryStatus.COMPLETED or reward is None:
            raise ValueError(
                f"trajectory {record.workflow_id} is {record.status.value} with reward {reward}: only "
                "completed, scored trajectories are trained on"
            )
        if record.context is None or not record.context.token_ids:
            raise ValueError(f"trajectory {record.workflow_id} has no token context; nothing to train on")
        if ref is not None:
            scores.append(_Score(ref.group, float(reward), ref.policy_version))
        else:
            scores.append(_Score(record.request.group, float(reward), min(record.context.turn_versions, default=0)))
    return scores


def _turn_advantages(
    records: Sequence[TrajectoryRecord], rewards: Sequence[float], cfg: CreditConfig, normalize_std: bool
) -> list[list[float]]:
    """One group's per-turn advantages ([i][t], a turn per completion span) in `cfg.mode`."""
    if cfg.mode == "tree":
        sequences = []
        for r in records:
            assert r.context is not None  # checked by _scores
            sequences.append((r.context.token_ids, r.context.turn_spans))
        nodes = turn_credit.prefix_nodes(sequences)
        return turn_credit.tree_advantages(rewards, nodes, normalize_std=normalize_std)
    anchors = []
    for r in records:
        assert r.context is not None
        turns = len(r.context.turn_spans)
        if len(r.turns) < turns - 1:
            raise ValueError(
                f"trajectory {r.workflow_id} has {turns} generated turns but {len(r.turns)} observations: "
                "step groups need the observation each turn answered"
            )
        anchors.append([r.first_observation, *(t.observation for t in r.turns)][:turns])
    return turn_credit.step_group_advantages(
        rewards, anchors, step_weight=cfg.step_weight, discount=cfg.discount, normalize_std=normalize_std
    )


def _spread(record: TrajectoryRecord, turns: Sequence[float]) -> list[float]:
    """Each turn's advantage on the tokens of its completion span; 0.0 elsewhere. Every loss token must lie in a
    span (the loss mask marks exactly the generated tokens)."""
    ctx = record.context
    assert ctx is not None
    out = [0.0] * len(ctx.token_ids)
    covered = [False] * len(ctx.token_ids)
    for (start, end), adv in zip(ctx.turn_spans, turns, strict=True):
        out[start:end] = [adv] * (end - start)
        covered[start:end] = [True] * (end - start)
    if any(m and not c for m, c in zip(ctx.loss_mask, covered, strict=True)):
        raise ValueError(f"trajectory {record.workflow_id} has loss tokens outside its turn spans: no turn to credit")
    return out


def samples_from_records(
    records: Sequence[TrajectoryRecord],
    *,
    normalize_std: bool,
    refs: Sequence[TrainRef] | None = None,
    credit: CreditConfig | None = None,
) -> list[TrainSample]:
    """TrainSamples in the records' order, with group-relative advantages (`trajflow.rl.advantages.group_advantages`).

    With `refs` (a train step's batch, aligned with `records`), each record's group, reward and policy version
    are the ref's: the training workflow's grouping is authoritative (it gives an ungrouped trajectory a group
    of its own, for one). Without, they come from the record: `request.group` (every record with the same group
    id, "" included, is one group), `reward`, and the oldest turn's version. A record that is not completed, has
    no reward or has no token context raises ValueError: unscored trajectories are never trained on.

    `credit` (None: mode `trajectory`) picks per-turn credit: in `step_groups` and `tree` mode each sample also
    gets `token_advantages`, its turns' advantages (`trajflow.rl.credit`) on their completion spans."""
    scores = _scores(records, refs)
    cfg = credit or CreditConfig()
    by_group: dict[str, list[int]] = defaultdict(list)
    for index, score in enumerate(scores):
        by_group[score.group].append(index)
    advantages = [0.0] * len(records)
    per_token: list[list[float] | None] = [None] * len(records)
    for indices in by_group.values():
        rewards = [scores[i].reward for i in indices]
        for i, adv in zip(indices, group_advantages(rewards, normalize_std=normalize_std), strict=True):
            advantages[i] = adv
        if cfg.mode != "trajectory":
            turns = _turn_advantages([records[i] for i in indices], rewards, cfg, normalize_std)
            for i, values in zip(indices, turns, strict=True):
                per_token[i] = _spread(records[i], values)
    samples = []
    for record, score, adv, token_adv in zip(records, scores, advantages, per_token, strict=True):
        ctx = record.context
        assert ctx is not None  # checked by _scores
        # behaviour logprobs were taken at the sampling temperature (greedy decoding records T = 1)
        temperature = record.request.sampling.temperature
        samples.append(
            TrainSample(
                token_ids=list(ctx.token_ids),
                behaviour_logprobs=list(ctx.logprobs),
                loss_mask=list(ctx.loss_mask),
                advantage=adv,
                version=score.version,
                temperature=temperature if temperature > 0 else 1.0,
                token_advantages=token_adv,
            )
        )
    return samples
