"""`trajflow branch WORKFLOW_ID --turn K --n M` (start M continuations of a finished trajectory from its turn K) and
`trajflow trajectories tree WORKFLOW_ID` (a trajectory and its branches, recursively, from visibility).

Branches are found by their `TrajflowBranchOf` search attribute, so the tree shows what visibility knows (it is
eventually consistent: a branch started a moment ago may be missing for a second). The tree is walked breadth
first, one visibility query per node that has branches, at most `limit` nodes.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass, field

from temporalio.client import Client, WorkflowExecution
from temporalio.common import SearchAttributeKey

from trajflow.cli.commands.visibility import quote, row_of
from trajflow.contracts import names
from trajflow.contracts.trajectory import TrajectoryResult

_BRANCH_TURN = SearchAttributeKey.for_float(names.SA_BRANCH_TURN)


@dataclass
class Node:
    """One trajectory of a tree: its outcome as visibility knows it, and its branches."""

    workflow_id: str
    branch_turn: int | None
    status: str
    reward: float | None
    turns: int | None
    branches: list[Node] = field(default_factory=list)


def _node(wf: WorkflowExecution) -> Node:
    row = row_of(wf)
    turn = wf.typed_search_attributes.get(_BRANCH_TURN)
    return Node(row.workflow_id, None if turn is None else int(turn), row.status, row.reward, row.turns)


def branches_query(parent: str) -> str:
    return f"WorkflowType = {quote(names.TRAJECTORY_WORKFLOW)} AND {names.SA_BRANCH_OF} = {quote(parent)}"


async def tree(client: Client, workflow_id: str, limit: int = 1000) -> Node | None:
    """The trajectory `workflow_id` with its branches, theirs and so on (None when visibility has no such one)."""
    roots = [_node(wf) async for wf in client.list_workflows(f"WorkflowId = {quote(workflow_id)}", limit=1)]
    if not roots:
        return None
    queue, seen = [roots[0]], 1
    while queue and seen < limit:
        node = queue.pop(0)
        async for wf in client.list_workflows(branches_query(node.workflow_id), limit=limit - seen):
            child = _node(wf)
            node.branches.append(child)
            queue.append(child)
            seen += 1
        node.branches.sort(key=lambda n: (n.branch_turn or 0, n.workflow_id))
    return roots[0]


def render(node: Node, depth: int = 0) -> list[str]:
    """One line per trajectory, branches indented under their parent: id, branch turn, status, reward, turns."""

    def show(v: object) -> str:
        return "-" if v is None else f"{v:g}" if isinstance(v, float) else str(v)

    at = f"  @turn {node.branch_turn}" if node.branch_turn else ""
    line = f"{'  ' * depth}{node.workflow_id}{at}  {node.status}  reward {show(node.reward)}  turns {show(node.turns)}"
    return [line, *(x for b in node.branches for x in render(b, depth + 1))]


async def tree_main(workflow_id: str, as_json: bool) -> int:
    from trajflow.infra.settings import load_settings
    from trajflow.infra.temporal import connect

    try:
        quote(workflow_id)
    except ValueError as e:
        print(e)
        return 2
    root = await tree(await connect(load_settings()), workflow_id)
    if root is None:
        print(f"no trajectory {workflow_id!r} in visibility")
        return 2
    print(json.dumps(asdict(root), indent=2) if as_json else "\n".join(render(root)))
    return 0


def outcome(workflow_id: str, result: TrajectoryResult | None, error: str | None = None) -> dict:
    if result is None:
        return {"workflow_id": workflow_id, "status": "unknown", "reward": None, "turns": None, "error": error}
    return {
        "workflow_id": workflow_id,
        "status": result.status.value,
        "reward": result.reward,
        "turns": result.turns,
        "error": result.error,
    }


async def branch_main(workflow_id: str, turn: int, n: int, wait: bool, timeout_s: float, as_json: bool) -> int:
    """Start the branches (refusals exit 2 before anything starts); with `wait`, print how each ended."""
    from trajflow.client import start_branches
    from trajflow.contracts.branches import BranchRefused
    from trajflow.infra.settings import load_settings
    from trajflow.infra.store import open_store_from
    from trajflow.infra.temporal import connect

    settings = load_settings()
    client = await connect(settings)
    try:
        handles = await start_branches(workflow_id, turn, n, client=client, store=open_store_from(settings))
    except (LookupError, BranchRefused) as e:
        print(f"cannot branch: {e}")
        return 2
    ids = [h.id for h in handles]
    if not as_json:
        print(f"started {len(ids)} branches of {workflow_id} at turn {turn}:", *ids, sep="\n  ")
    if not wait:
        if as_json:
            print(json.dumps({"parent": workflow_id, "turn": turn, "branches": [{"workflow_id": i} for i in ids]}))
        return 0
    try:
        results = await asyncio.wait_for(
            asyncio.gather(*(h.result() for h in handles), return_exceptions=True), timeout_s
        )
    except TimeoutError:
        print(f"the branches did not all end within {timeout_s:g}s; `trajflow trajectories tree {workflow_id}`")
        return 1
    rows = [
        outcome(i, None, str(r)) if isinstance(r, BaseException) else outcome(i, r)
        for i, r in zip(ids, results, strict=True)
    ]
    if as_json:
        print(json.dumps({"parent": workflow_id, "turn": turn, "branches": rows}, indent=2))
    else:
        for r in rows:
            print(f"{r['workflow_id']}  {r['status']}  reward {r['reward']}  turns {r['turns']}", end="")
            print(f"  ({r['error']})" if r["error"] else "")
    return 0 if all(r["status"] == "completed" for r in rows) else 1
