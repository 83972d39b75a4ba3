"""Tree rollouts without Temporal: the branch plan (workflows/trees.py), a tree group's bookkeeping in `Book` (roots,
branches queued when a root completes, replacements, abandonment, admission), and what the config refuses."""

from __future__ import annotations

from collections import Counter

import pytest
from pydantic import ValidationError

from trajflow.contracts.rollouts import BranchPlan, RolloutConfig, TreeRoot
from trajflow.contracts.tasks import TaskConfig
from trajflow.contracts.training import GroupState, TrainingRunConfig, TrainingState, TrainStepResult
from trajflow.contracts.trajectory import TrajectoryReport, TrajectoryStatus
from trajflow.workflows import trees
from trajflow.workflows.bookkeeping import Book

TREE = {"mode": "tree", "roots": 2}


def book(**fields) -> Book:
    fields.setdefault("tasks", [TaskConfig()])
    fields.setdefault("rollout", TREE)
    return Book(TrainingRunConfig(**fields), TrainingState(run_id="run"))


def admit(b: Book) -> list[list[str]]:
    """Admit what the budget allows as the workflow does (`trees.starts` members a group); the roots' ids."""
    out = []
    for _ in range(b.groups_to_admit()):
        g = b.new_group()
        out.append([b.new_member(g) for _ in range(trees.starts(b.cfg))])
        for _ in out[-1]:
            b.member_started()
    return out


def start_branches(b: Book) -> list[tuple[str, BranchPlan]]:
    """Start every queued branch as the workflow does (`members.start_member` with a plan)."""
    started = []
    while (nxt := b.next_branch()) is not None:
        g, plan = nxt
        wid = b.new_member(g)
        assert g.tree is not None
        g.tree.branches.append(wid)
        b.member_started()
        started.append((wid, plan))
    return started


def report(wid: str, ok: bool = True, turns: int = 4, version: int = 0, reward: float = 1.0) -> TrajectoryReport:
    status = TrajectoryStatus.COMPLETED if ok else TrajectoryStatus.FAILED
    return TrajectoryReport(workflow_id=wid, trajectory_uri=f"file:///t/{wid}.json" if ok else None,
                            group=wid.split("-")[1], policy_version=version, reward=reward if ok else None,
                            status=status, turns=turns)  # fmt: skip


def test_branch_turn_is_deterministic_uniform_over_2_to_T_and_1_for_a_one_turn_root() -> None:
    turns = [trees.branch_turn(7, 100, b, 5) for b in range(2000)]
    assert turns == [trees.branch_turn(7, 100, b, 5) for b in range(2000)]
    counts = Counter(turns)
    assert set(counts) == {2, 3, 4, 5}
    assert all(400 < c < 600 for c in counts.values()), counts  # 500 each if uniform
    assert {trees.branch_turn(s, 100, 0, 1) for s in range(50)} == {1}
    assert trees.branch_turn(7, 100, 0, 2) == 2
    assert [trees.branch_turn(8, 100, b, 5) for b in range(50)] != turns[:50]  # the run seed matters


def test_shares_spread_the_branches_round_robin_over_the_roots() -> None:
    cfg = TrainingRunConfig(group_size=8, batch_size=8, rollout=RolloutConfig(mode="tree", roots=3))
    assert [trees.share(cfg, j) for j in range(3)] == [[0, 3], [1, 4], [2]]
    g = GroupState(group="g000000", seed=5, task=0, started_version=0)
    root = TreeRoot(workflow_id="r", record_uri="file:///r.json", turns=3)
    assert trees.plan(cfg, g, root, 4) == BranchPlan(
        parent="r", record_uri="file:///r.json", turn=trees.branch_turn(cfg.seed, 5, 4, 3), index=4
    )


def test_a_tree_group_starts_its_roots_then_each_completed_root_queues_its_branches() -> None:
    b = book(steps=2, batch_size=4, group_size=4, alpha=0)
    [roots] = admit(b)
    assert len(roots) == 2 and b.running() == 4  # the pending branches count as in flight
    assert b.next_branch() is None
    b.report(report(roots[1], turns=3))  # the second root completes first: it is the group's root 0
    [(w2, p0)] = start_branches(b)
    assert (p0.parent, p0.index, p0.record_uri) == (roots[1], 0, f"file:///t/{roots[1]}.json")
    assert 2 <= p0.turn <= 3
    b.report(report(roots[0], turns=1))
    [(w3, p1)] = start_branches(b)
    assert (p1.parent, p1.index, p1.turn) == (roots[0], 1, 1)  # a one-turn root: a fresh sample of its episode
    assert not b.ready_groups()
    b.report(report(w2))
    b.report(report(w3))
    [g] = b.ready_groups()
    assert len(g.completed) == 4 and g.failed == 0
    step = b.take_batch()
    assert step is not None and len(step.refs) == 4 and {r.group for r in step.refs} == {g.group}


def test_failed_roots_are_replaced_by_roots_failed_branches_by_branches_of_a_completed_root() -> None:
    b = book(steps=2, batch_size=4, group_size=4, alpha=0, max_group_restarts=2)
    [roots] = admit(b)
    b.report(report(roots[0], ok=False))
    assert b.next_branch() is None
    group, missing = b.next_replacement()  # type: ignore[misc]
    assert missing == 1
    new_root = b.new_member(group)
    b.member_started()
    b.report(report(roots[1], turns=2))
    [(w_a, p_a)] = start_branches(b)
    assert p_a.parent == roots[1] and p_a.turn == 2
    b.report(report(w_a, ok=False))  # a branch fails: another branch, index n - R, of a completed root
    [(w_b, p_b)] = start_branches(b)
    assert (p_b.parent, p_b.index) == (roots[1], 2)
    b.report(report(new_root, turns=2))  # the replacement root takes the failed root's share
    [(w_c, p_c)] = start_branches(b)
    assert (p_c.parent, p_c.index) == (new_root, 1)
    b.report(report(w_b))
    b.report(report(w_c))
    [g] = b.ready_groups()
    assert len(g.completed) == 4 and g.failed == 2 and b.s.counters.groups_abandoned == 0


def test_a_tree_group_is_abandoned_past_the_restart_budget_with_its_queued_branches() -> None:
    b = book(steps=2, batch_size=4, group_size=4, alpha=0, max_group_restarts=1)
    [roots] = admit(b)
    b.report(report(roots[0], turns=3))
    out = b.report(report(roots[1], ok=False))
    assert out.abandoned is None and b.replacements  # one restart: a new root
    out = b.report(report(start_branches(b)[0][0], ok=False))  # a second failure passes the budget
    assert out.abandoned is not None and b.s.counters.groups_abandoned == 1
    assert not b.s.groups and b.next_branch() is None
    assert b.groups_to_admit() == 1  # the abandoned group's slots are free: a new seed is admitted


def test_all_roots_failing_abandons_the_group_and_admission_is_not_overrun() -> None:
    b = book(steps=3, batch_size=4, group_size=4, alpha=1, max_group_restarts=0)
    groups = admit(b)
    assert len(groups) == 2 and b.groups_to_admit() == 0  # (α + 1)·B = 8 = 2 groups of 4, branches included
    b.report(report(groups[0][0], ok=False))
    assert b.s.counters.groups_abandoned == 1 and b.to_cancel == [groups[0][1]]
    assert b.groups_to_admit() == 1


def test_branches_wait_while_admission_is_paused_or_stopping() -> None:
    b = book(steps=2, batch_size=4, group_size=4, alpha=0)
    [roots] = admit(b)
    b.report(report(roots[0]))
    assert b.next_branch(pause_admission=True) is None and not b.has_work(pause_admission=True)
    assert b.has_work() and b.next_branch() is not None


def test_a_plain_run_has_no_tree_state_and_starts_n_plus_r() -> None:
    b = book(steps=2, batch_size=4, group_size=4, redundancy=1, rollout={"mode": "groups"})
    assert trees.starts(b.cfg) == 5 and b.new_group().tree is None


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"rollout": {"mode": "tree", "roots": 4}}, "must be less than group_size"),
        ({"rollout": TREE, "redundancy": 1}, "no redundancy"),
        ({"rollout": TREE, "groups_per_shard": 2}, "direct runs only"),
        ({"rollout": TREE, "tasks": [TaskConfig(env_id="agent:mod:fn")]}, "cannot branch agent envs"),
    ],
)
def test_the_config_refuses_what_tree_rollouts_do_not_support(fields: dict, says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        TrainingRunConfig(**fields)


def test_a_trained_tree_group_leaves_the_budget_for_the_next() -> None:
    b = book(steps=2, batch_size=4, group_size=4, alpha=0)
    [roots] = admit(b)
    for wid in roots:
        b.report(report(wid))
    for wid, _ in start_branches(b):
        b.report(report(wid))
    step = b.take_batch()
    assert step is not None
    b.finish_step(step, TrainStepResult(version=1, weights_uri=None), time_s=1.0)
    assert len(admit(b)) == 1


def test_queued_branches_survive_a_continue_as_new() -> None:
    b = book(steps=2, batch_size=4, group_size=4, alpha=0)
    [roots] = admit(b)
    b.report(report(roots[0], turns=3))
    carried = TrainingState.model_validate_json(b.s.model_dump_json())  # what continue-as-new passes on
    resumed = Book(b.cfg, carried)
    assert resumed.has_work()
    [(wid, plan)] = start_branches(resumed)
    assert plan.parent == roots[0] and plan.index == 0 and resumed.running_members() == [roots[1], wid]


def test_a_tree_groups_oldest_version_comes_from_its_members_reports_branches_included() -> None:
    b = book(steps=4, batch_size=4, group_size=4, alpha=1)
    [roots, _] = admit(b)
    for wid in roots:
        b.report(report(wid, version=2))
    b.s.version = 3  # as if steps were trained meanwhile
    [(w1, _), (w2, _)] = start_branches(b)
    b.report(report(w1, version=2))
    assert not b.drop_stale()
    b.report(report(w2, version=1))  # a branch's version is the oldest of its turns, its root's prefix included
    [stale] = b.drop_stale()
    assert stale.group == "g000000" and b.s.counters.dropped_stale == 4
