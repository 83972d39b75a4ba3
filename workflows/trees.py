"""Tree rollouts' plan, pure (`[train] rollout = { mode = "tree", roots = R }`): which root each branch of a group
takes, at which turn, with which index; and what a tree group does when a member ends. Stdlib and `contracts`
only, like `trajflow.workflows.flat`; the direct run's `Book` (workflows/bookkeeping.py) asks it, the training workflow
starts what it queues (in the group's `TreeState`, so a continue-as-new carries it).

The plan. A group of n = group_size starts R roots as a plain group starts its members. When a root completes it
is the group's j-th completed root (0-based, in completion order) and its share of the n - R branches is queued:
branch b (0 <= b < n - R) belongs to the j-th root when b mod R = j, so the branches are spread round robin over
the roots. Branch b samples from turn k = 2 + h mod (T - 1), h a hash of the run's seed, the group's env seed and
b, T the root's turns: uniform over 2..T, so that it shares at least the root's first turn; k = 1 when T = 1 (a
fresh sample of the same episode). Its sampling seed is the member's, as for any member (`member_seed` of its
number in the group).

Failures, within the group's restart budget (`max_group_restarts` replacements, each failure replaced at once): a
root that fails is replaced by a new root (the group's `replacements`, as today), which takes the failed root's
share when it completes; a branch that fails is replaced by a new branch (the next index b) of the completed root
b mod (roots completed). Past the budget the group is abandoned (every root failed, or branches keep
failing: e.g. an env that does not replay). Abandoned, trained or dropped, a group's queued branches go with it.

Limits: which root gets which share follows the order the roots complete in, which timing decides (as it decides
which redundant sample makes a plain group), and so does a branch's turn where the roots' lengths differ; with
equal lengths (or R = 1) the plan depends on the run's seed only. A stop ends branch starts with replacements (a
tree group waiting for branches is then not completed). Direct runs only.
"""

from __future__ import annotations

from trajflow.contracts.rollouts import BranchPlan, TreeRoot, TreeState
from trajflow.contracts.training import GroupState, TrainingRunConfig, TrainingState
from trajflow.contracts.trajectory import TrajectoryReport, TrajectoryStatus, derive_seed

TREE_SALT = 0x74726565
"""Mixed into the hash of a branch's turn ("tree"), so it is unrelated to any sampling seed."""


def new_tree(cfg: TrainingRunConfig) -> TreeState | None:
    """A new group's tree state: None unless the run rolls out trees."""
    if cfg.rollout.mode != "tree":
        return None
    return TreeState(next_index=cfg.group_size - cfg.rollout.roots)


def starts(cfg: TrainingRunConfig) -> int:
    """Members a new group starts at once: R roots in tree mode, n + r otherwise."""
    return cfg.rollout.roots if cfg.rollout.mode == "tree" else cfg.group_size + cfg.redundancy


def branch_turn(run_seed: int, group_seed: int, index: int, turns: int) -> int:
    """Branch `index`'s turn on a root of `turns` turns: uniform over 2..turns from the hash; 1 for a root of one."""
    if turns <= 1:
        return 1
    return 2 + derive_seed(TREE_SALT, run_seed, group_seed, index) % (turns - 1)


def plan(cfg: TrainingRunConfig, g: GroupState, root: TreeRoot, index: int) -> BranchPlan:
    return BranchPlan(
        parent=root.workflow_id,
        record_uri=root.record_uri,
        turn=branch_turn(cfg.seed, g.seed, index, root.turns),
        index=index,
    )


def share(cfg: TrainingRunConfig, j: int) -> list[int]:
    """The branch indices of the group's j-th completed root (0-based): b < n - R with b mod R = j."""
    roots = cfg.rollout.roots
    return [b for b in range(cfg.group_size - roots) if b % roots == j]


def after_report(cfg: TrainingRunConfig, g: GroupState, report: TrajectoryReport, replacements: dict[str, int]) -> bool:
    """A member of tree group `g` ended and its group is not full: queue the branches of a root that completed, or a
    replacement for a member that failed. True when the failure is past the restart budget (abandon the group)."""
    tree = g.tree
    assert tree is not None
    completed = report.status is TrajectoryStatus.COMPLETED and report.reward is not None and report.trajectory_uri
    is_branch = report.workflow_id in tree.branches
    if completed and report.trajectory_uri:
        if not is_branch:
            root = TreeRoot(workflow_id=report.workflow_id, record_uri=report.trajectory_uri, turns=report.turns)
            tree.roots.append(root)
            j = len(tree.roots) - 1
            tree.queued.extend(plan(cfg, g, root, b) for b in share(cfg, j))
        return False
    if g.failed > cfg.max_group_restarts:  # every failure so far was replaced: this one would pass the budget
        return True
    if is_branch:
        b = tree.next_index
        tree.next_index += 1
        tree.queued.append(plan(cfg, g, tree.roots[b % len(tree.roots)], b))
    else:
        replacements[g.group] = replacements.get(g.group, 0) + 1
    return False


def queued(s: TrainingState) -> bool:
    """Some open tree group has a branch waiting to start."""
    return any(g.tree is not None and g.tree.queued for g in s.groups.values())


def next_branch(s: TrainingState) -> tuple[GroupState, BranchPlan] | None:
    """The next queued branch (groups in admission order, each group's in plan order), taken off its queue."""
    for g in s.groups.values():
        if g.tree is not None and g.tree.queued:
            return g, g.tree.queued.pop(0)
    return None
