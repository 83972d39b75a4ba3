"""trajflow.rl.credit: GiGPO step-group and tree advantages per turn, on small groups worked out by hand, and their
edge cases (one trajectory, equal rewards, ragged turn counts, a state revisited, no shared prefix)."""

from __future__ import annotations

import pytest

from trajflow.rl.advantages import group_advantages
from trajflow.rl.credit import discounted_returns, prefix_nodes, step_group_advantages, tree_advantages


def test_discounted_returns_put_the_outcome_at_the_last_turn() -> None:
    # r = (0, 0, 2): G_0 = 0.5^2 x 2, G_1 = 0.5 x 2, G_2 = 2
    assert discounted_returns(2.0, 3, 0.5) == pytest.approx([0.5, 1.0, 2.0])
    assert discounted_returns(1.0, 0, 0.5) == []


def test_step_groups_by_hand() -> None:
    # gamma 0.5, omega 1, Dr. GRPO normalisation (x - mean of its set).
    # A: R=1, anchors (s0, x) -> returns (0.5, 1); B: R=0, anchors (s0, x, y) -> (0, 0, 0); C: R=1, (s0) -> (1).
    # Episode: mean 2/3 -> A_E = (1/3, -2/3, 1/3).
    # Step group s0: (0.5, 0, 1), mean 0.5 -> (0, -0.5, 0.5); x: (1, 0), mean 0.5 -> (0.5, -0.5); y: B's alone -> 0.
    # A: (1/3 + 0, 1/3 + 0.5); B: (-2/3 - 0.5, -2/3 - 0.5, -2/3 + 0); C: (1/3 + 0.5).
    out = step_group_advantages(
        [1.0, 0.0, 1.0],
        [["s0", "x"], ["s0", "x", "y"], ["s0"]],
        step_weight=1.0,
        discount=0.5,
        normalize_std=False,
    )
    assert out[0] == pytest.approx([1 / 3, 5 / 6])
    assert out[1] == pytest.approx([-7 / 6, -7 / 6, -2 / 3])
    assert out[2] == pytest.approx([5 / 6])


def test_step_weight_scales_the_step_term_and_zero_leaves_the_episode_advantage() -> None:
    rewards, anchors = [1.0, 0.0, 1.0], [["s0", "x"], ["s0", "x", "y"], ["s0"]]
    half = step_group_advantages(rewards, anchors, step_weight=0.5, discount=0.5, normalize_std=False)
    assert half[0] == pytest.approx([1 / 3, 1 / 3 + 0.25])  # step terms (0, 0.5) halved
    none = step_group_advantages(rewards, anchors, step_weight=0.0, discount=0.5, normalize_std=False)
    assert none == [[a] * len(t) for a, t in zip(group_advantages(rewards, normalize_std=False), anchors, strict=True)]


def test_step_groups_normalise_by_the_std_like_the_episode_advantage() -> None:
    # Step group s0 returns (0.5, 0, 1): mean 0.5, population std sqrt(1/6) -> (0, -sqrt(1.5), +sqrt(1.5)).
    # Episode (1, 0, 1): mean 2/3, std sqrt(2)/3 -> (1/sqrt(2), -sqrt(2), 1/sqrt(2)).
    out = step_group_advantages(
        [1.0, 0.0, 1.0], [["s0", "x"], ["s0", "x", "y"], ["s0"]], step_weight=1.0, discount=0.5, normalize_std=True
    )
    root2, root15 = 2**0.5, 1.5**0.5
    assert out[0][0] == pytest.approx(1 / root2, abs=1e-5)
    assert out[1][0] == pytest.approx(-root2 - root15, abs=1e-5)
    assert out[2][0] == pytest.approx(1 / root2 + root15, abs=1e-5)
    assert out[1][2] == pytest.approx(-root2, abs=1e-5)  # y's step group has one member: step term 0


def test_a_state_revisited_is_one_more_member_of_its_step_group() -> None:
    # gamma 0.5. A: R=1, anchors (s0, s0) -> returns (0.5, 1); B: R=0, (s0) -> (0). Step group s0: (0.5, 1, 0),
    # mean 0.5 -> (0, 0.5, -0.5). Episode (0.5, -0.5). A: (0.5, 1.0); B: (-1.0).
    out = step_group_advantages([1.0, 0.0], [["s0", "s0"], ["s0"]], step_weight=1.0, discount=0.5, normalize_std=False)
    assert out == [pytest.approx([0.5, 1.0]), pytest.approx([-1.0])]


@pytest.mark.parametrize("normalize_std", [True, False])
def test_step_groups_edge_cases_give_exact_zeros(normalize_std: bool) -> None:
    kw = {"step_weight": 1.0, "discount": 0.9, "normalize_std": normalize_std}
    assert step_group_advantages([1.0], [["s0", "a"]], **kw) == [[0.0, 0.0]]  # one trajectory
    # equal rewards and equal lengths: every step group holds equal returns
    assert step_group_advantages([1.0, 1.0], [["s0", "a"], ["s0", "b"]], **kw) == [[0.0, 0.0], [0.0, 0.0]]
    assert step_group_advantages([], [], **kw) == []
    with pytest.raises(ValueError, match="aligned"):
        step_group_advantages([1.0, 0.0], [["s0"]], **kw)
    with pytest.raises(ValueError, match="finite"):
        step_group_advantages([float("nan"), 0.0], [["s0"], ["s0"]], **kw)


def _sequence(turns: list[list[int]]) -> tuple[list[int], list[tuple[int, int]]]:
    """A prompt token 100, then each turn's completion followed by an observation token 9."""
    ids, spans = [100], []
    for completion in turns:
        spans.append((len(ids), len(ids) + len(completion)))
        ids += [*completion, 9]
    return ids, spans


# The tree of the next tests. P is a root trajectory; S branches from it at turn 3 (shares turns 1-2), Q at turn 2
# (shares turn 1); T is an independent root.  a=[1, 2], b=[3], c=[4], d=[5], e=[6], f=[7], g=[8].
A, B, C, D, E, F, G = [1, 2], [3], [4], [5], [6], [7], [8]
TREE = {"P": ([A, B, C], 1.0), "Q": ([A, D], 0.0), "S": ([A, B, E], 0.0), "T": ([F, G], 1.0)}


def test_prefix_nodes_share_exactly_the_common_prefix() -> None:
    nodes = prefix_nodes([_sequence(turns) for turns, _ in TREE.values()])
    p, q, s, t = nodes
    assert p[0] == q[0] == s[0] and p[1] == s[1]
    assert len({p[1], q[1]}) == 2 and len({p[2], s[2]}) == 2 and not set(t) & {*p, *q, *s}
    # the same completion after a different observation is a different node
    ids, spans = _sequence([A, B])
    ids[spans[0][1]] = 10
    first, second = prefix_nodes([_sequence([A, B]), (ids, spans)])
    assert first[0] == second[0] and first[1] != second[1]
    with pytest.raises(ValueError, match="span"):
        prefix_nodes([([1, 2], [(1, 3)])])


def test_tree_advantages_by_hand() -> None:
    # Dr. GRPO scale. Group mean (1 + 0 + 0 + 1) / 4 = 1/2. V(a) = mean(P, Q, S) = 1/3, V(ab) = mean(P, S) = 1/2,
    # V(abc) = 1, V(ad) = 0, V(abe) = 0, V(f) = V(fg) = 1.
    # P: (1/3 - 1/2, 1/2 - 1/3, 1 - 1/2) = (-1/6, 1/6, 1/2), summing to R - mean = 1/2.
    # Q: (-1/6, 0 - 1/3) = (-1/6, -1/3); S: (-1/6, 1/6, 0 - 1/2) = (-1/6, 1/6, -1/2).
    # T: (1 - 1/2, then node f has only T through it, so the baseline stays the root's: 1 - 1/2) = (1/2, 1/2).
    nodes = prefix_nodes([_sequence(turns) for turns, _ in TREE.values()])
    rewards = [reward for _, reward in TREE.values()]
    p, q, s, t = tree_advantages(rewards, nodes, normalize_std=False)
    assert p == pytest.approx([-1 / 6, 1 / 6, 1 / 2])
    assert q == pytest.approx([-1 / 6, -1 / 3])
    assert s == pytest.approx([-1 / 6, 1 / 6, -1 / 2])
    assert t == pytest.approx([1 / 2, 1 / 2])
    # with the std: every value divided by the group's reward std (1/2) + eps
    scaled = tree_advantages(rewards, nodes, normalize_std=True)
    assert scaled[0] == pytest.approx([-1 / 3, 1 / 3, 1.0], abs=1e-5)


def test_a_group_without_shared_prefixes_gets_the_trajectory_advantage_at_every_turn() -> None:
    # Plain GRPO groups, ragged turn counts: Dr. GRPO's r - mean (mean 0.5) at every turn, GRPO's with the std.
    rewards = [1.0, 0.0, 0.0, 1.0]
    nodes = prefix_nodes([_sequence(turns) for turns in ([A], [B, C, D], [C, A], [D, B])])
    assert tree_advantages(rewards, nodes, normalize_std=False) == [[0.5], [-0.5] * 3, [-0.5] * 2, [0.5] * 2]
    grpo = group_advantages(rewards, normalize_std=True)
    out = tree_advantages(rewards, nodes, normalize_std=True)
    assert out == [[grpo[i]] * len(path) for i, path in enumerate(nodes)]


@pytest.mark.parametrize("normalize_std", [True, False])
def test_tree_edge_cases_give_exact_zeros(normalize_std: bool) -> None:
    one = prefix_nodes([_sequence([A, B])])
    assert tree_advantages([1.0], one, normalize_std=normalize_std) == [[0.0, 0.0]]
    same = prefix_nodes([_sequence([A, B]), _sequence([A, C, D])])
    assert tree_advantages([0.5, 0.5], same, normalize_std=normalize_std) == [[0.0, 0.0], [0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="aligned"):
        tree_advantages([1.0, 0.0], one, normalize_std=normalize_std)
