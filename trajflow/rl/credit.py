"""Per-turn credit: advantages for each turn of a group's trajectories, from the group's outcomes (no torch).

A group is the trajectories of one prompt (one env seed). `trajflow.rl.advantages` gives each trajectory one scalar;
the two modes here give each of its turns one, which `trajflow.rl.samples` spreads over that turn's generated tokens.
Both use only the trajectories' rewards R_i (the outcome) and the group's structure; "normalise" below is
`group_advantages` with the run's `normalize_adv_std` (GRPO's (x - mean) / (std + eps), population std, or Dr.
GRPO's x - mean; a set of one, or of equal values, gets exactly 0).

- `step_group_advantages` (GiGPO: Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training",
  arXiv 2505.10978): A(i, t) = A_E(i) + omega * A_S(i, t). A_E is the episode advantage, R_i normalised over the
  group (today's trajectory advantage). Turns that act from the same *anchor state* form a step group: the anchor
  of turn t is the observation it answered (the first observation for turn 0, else turn t-1's), compared as exact
  text, across every trajectory of the group and within one (a state revisited is one more member). A_S(i, t) is
  turn t's discounted return G(i, t) = sum_{k >= t} gamma^(k - t) r(i, k), normalised within its step group.
  Per-turn rewards: only the outcome R_i is known per trajectory, so r(i, k) = R_i at its last turn and 0 before
  (GiGPO's sparse-reward setting), G(i, t) = gamma^(T_i - 1 - t) R_i. The env's per-step rewards are not used:
  the outcome may come from a verifier, and adding both would count it twice.
- `tree_advantages` (for branched rollouts, where trajectories share their first turns exactly): a node of the
  group's tree is a trajectory's exact token prefix through turn t's completion (`prefix_nodes`), so two
  trajectories share node t iff everything up to and including their turn-t completions is identical; the root is
  the group. V(node) = the mean reward of the group's trajectories through it, V(root) = the group mean, and
  A(i, t) = V(node t) - B(node t - 1): how much turn t's action moved the expected outcome, against the value B of
  the state it acted from. B(node) = V(node) when several trajectories pass through it; a node only one passes
  through has no value of its own to compare with (it would be R_i, and every later turn of that trajectory would
  get 0), so B falls back to its nearest ancestor that several share, the root at worst. Where the state is shared
  this is the local "V(s_n) - V(parent)" term of TreeRL's process signal (Hou et al. 2025, "TreeRL: LLM
  Reinforcement Learning with On-Policy Tree Search", arXiv 2506.11902, without its global term and leaf-count
  scaling); after the last branch point it is R_i less the mean of the siblings that share the prefix (Tree-GRPO's
  intra-tree comparison: Ji et al. 2025, "Tree Search for LLM Agent Reinforcement Learning", arXiv 2509.21240).
  A group without shared prefixes gets R_i - mean at every turn (Dr. GRPO). With normalize_adv_std every value is
  divided by the group's reward std (+ eps), GRPO's scale, so such a group gets exactly today's GRPO advantage.

Limits: the anchor is the observation text alone, so an env whose observations do not identify the state (the same
"higher" after different guesses) pools different states into one step group; per-turn env rewards are ignored;
a tree needs the branches' prefixes to be token-identical (branching reuses the parent's context, so they are).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence

from trajflow.rl.advantages import group_advantages


def _check(rewards: Sequence[float], per_turn: Sequence[Sequence[object]], name: str) -> list[float]:
    values = [float(r) for r in rewards]
    if len(per_turn) != len(values):
        raise ValueError(f"{len(values)} rewards but {len(per_turn)} trajectories of {name}: they must be aligned")
    if any(not math.isfinite(r) for r in values):
        raise ValueError(f"rewards must be finite, got {values}")
    return values


def discounted_returns(reward: float, turns: int, discount: float) -> list[float]:
    """G_t = sum_{k >= t} discount^(k - t) r_k for r = (0, ..., 0, reward): discount^(turns - 1 - t) x reward."""
    return [reward * discount ** (turns - 1 - t) for t in range(turns)]


def step_group_advantages(
    rewards: Sequence[float],
    anchors: Sequence[Sequence[str]],
    *,
    step_weight: float,
    discount: float,
    normalize_std: bool,
    eps: float = 1e-6,
) -> list[list[float]]:
    """GiGPO's advantage of every turn of one group (see the module docstring): `anchors[i][t]` is the observation
    turn t of trajectory i acted from. Returns [i][t], aligned with `anchors`."""
    values = _check(rewards, anchors, "anchors")
    episode = group_advantages(values, normalize_std=normalize_std, eps=eps)
    returns = [discounted_returns(r, len(a), discount) for r, a in zip(values, anchors, strict=True)]
    members: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for i, turn_anchors in enumerate(anchors):
        for t, anchor in enumerate(turn_anchors):
            members[anchor].append((i, t))
    step = [[0.0] * len(a) for a in anchors]
    for group in members.values():
        normalised = group_advantages([returns[i][t] for i, t in group], normalize_std=normalize_std, eps=eps)
        for (i, t), adv in zip(group, normalised, strict=True):
            step[i][t] = adv
    return [[episode[i] + step_weight * s for s in step[i]] for i in range(len(values))]


def prefix_nodes(sequences: Sequence[tuple[Sequence[int], Sequence[tuple[int, int]]]]) -> list[list[int]]:
    """The tree node each turn of a group's trajectories reaches, from each one's (token_ids, turn_spans): node
    ids [i][t], equal for two trajectories iff their token ids up to the end of turn t are equal (the prompt,
    every observation and every completion so far). Each turn's tokens are hashed once (interned under the id of
    the node before), so the cost is linear in the tokens, and the comparison is exact."""
    ids: dict[tuple[int, tuple[int, ...]], int] = {}
    out = []
    for token_ids, turn_spans in sequences:
        node, previous_end, path = -1, 0, []
        for start, end in turn_spans:
            if not previous_end <= start <= end <= len(token_ids):
                raise ValueError(f"turn span {(start, end)} is out of order or outside the {len(token_ids)} tokens")
            node = ids.setdefault((node, tuple(token_ids[previous_end:end])), len(ids))
            path.append(node)
            previous_end = end
        out.append(path)
    return out


def tree_advantages(
    rewards: Sequence[float], nodes: Sequence[Sequence[Hashable]], *, normalize_std: bool, eps: float = 1e-6
) -> list[list[float]]:
    """The tree advantage of every turn of one group (see the module docstring): `nodes[i][t]` is the node
    trajectory i reaches after turn t (`prefix_nodes`). Returns [i][t], aligned with `nodes`."""
    values = _check(rewards, nodes, "nodes")
    if len(values) < 2 or max(values) == min(values):
        return [[0.0] * len(n) for n in nodes]
    through: dict[Hashable, list[float]] = defaultdict(list)
    for reward, path in zip(values, nodes, strict=True):
        for node in path:  # a path's nodes are distinct prefixes
            through[node].append(reward)
    value = {node: sum(rs) / len(rs) for node, rs in through.items()}
    mean = sum(values) / len(values)
    scale = 1.0
    if normalize_std:
        scale = math.sqrt(sum((r - mean) ** 2 for r in values) / len(values)) + eps
    out = []
    for path in nodes:
        # baseline[t]: the value of the state turn t acted from, or of its deepest ancestor that several share
        baseline, turns = mean, []
        for node in path:
            turns.append((value[node] - baseline) / scale)
            if len(through[node]) > 1:
                baseline = value[node]
        out.append(turns)
    return out
