"""Branching a recorded trajectory at a turn, through the real stack: Temporal dev server, Docker sandboxes running
GEM's GuessTheNumber, the reward service, a local store.

The policy is a seed-scripted engine: each completion is a guess the request's sampling seed picks (out of the
game's range, so the episode runs to its turn limit). Each turn of a trajectory has its own seed and each branch
its own sampling seed, so a branch that reused its parent's turns 1..k-1 shows them exactly, and what it samples
from turn k on is visibly its own. Covered: the client's `start_branches` (prefix turns, tokens and the turn-k
observation equal to the parent's; branches differ from turn k; a branch of a branch), the search attributes and
`trajectories tree`,
a branch started with only `branch_of` and `branch_turn` (the Temporal UI's form) at k = 1, the refusals (client:
turn out of range, unknown workflow; workflow: no parent record, and a restored env whose observation differs from
the record's), and `trajflow branch --json --wait` and `trajflow trajectories tree` as a user runs them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import async_wait_for, running_stack
from trajflow.cli.commands.branch import tree
from trajflow.client import start_branches
from trajflow.contracts.branches import BranchRefused
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.trajectory import SamplingParams, TrajectoryStatus
from trajflow.rl.engines.scripted import ScriptedEngine

pytestmark = pytest.mark.integration

K = 2


class SeedScriptedEngine(ScriptedEngine):
    """Guesses a number its request's sampling seed picks, 100..899: the easy game's range is 1..10, so the game
    answers that it is out of range and goes on."""

    async def generate(self, prompt_ids, params, policy=""):
        self._script = [f"I guess \\boxed{{{100 + (params.seed or 0) % 800}}}"]
        return await super().generate(prompt_ids, params, policy)


@pytest.fixture()
def seeded(tiny_model):
    from transformers import AutoTokenizer

    return SeedScriptedEngine(AutoTokenizer.from_pretrained(tiny_model), "unused")


def guess(seed: int | None, turn: int) -> str:
    """What the engine answers at `turn` (0-based) of a trajectory whose sampling seed is `seed`."""
    return f"I guess \\boxed{{{100 + (SamplingParams(seed=seed).for_turn(turn).seed or 0) % 800}}}"


def load(store, uri: str | None) -> TrajectoryRecord:
    assert uri is not None
    return TrajectoryRecord.model_validate(store.get_json(uri))


def through_turn(record: TrajectoryRecord, turns: int) -> tuple[list, list[int]]:
    """The record's messages through turn `turns`' user message, and its tokens through turn `turns`-1's end."""
    ctx = record.context
    assert ctx is not None
    users = [i for i, m in enumerate(ctx.messages) if m.role == "user"]
    return ctx.messages[: users[turns - 1] + 1], ctx.token_ids[: ctx.turn_spans[turns - 2][1]]


async def test_branches_start_from_the_parents_state_and_differ_from_there(
    temporal_env, reward_service, store, sandbox_manager, seeded, tmp_path
):
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, seeded) as st:
        req = st.request(seed=5, max_turns=3, sampling=SamplingParams(temperature=1.0, seed=7))
        parent = await st.run(req, workflow_id=f"parent-{st.tag}")
        assert parent.status is TrajectoryStatus.COMPLETED and parent.turns == 3, parent
        handles = await start_branches(parent.workflow_id, K, 3, client=st.client, store=st.store)
        results = await asyncio.gather(*(h.result() for h in handles))
        # a branch of a branch: its prefix holds the grandparent's turn 1 and its parent's own turn 2
        [nested] = await start_branches(handles[0].id, 3, 1, client=st.client, store=st.store)
        grandchild = await nested.result()

        # the Temporal UI's form: only branch_of and branch_turn (and this test's pools); k = 1 reuses nothing
        ui = await st.run(st.request(branch_of=parent.workflow_id, branch_turn=1))
        missing = await st.run(st.request(branch_of=f"nobody-{st.tag}", branch_turn=2))
        # a parent whose recorded observation the env does not reproduce (as a non-deterministic env would not)
        tampered = load(st.store, parent.trajectory_uri)
        turn1 = tampered.turns[0].model_copy(update={"observation": "not what the env says"})
        tampered = tampered.model_copy(update={"turns": [turn1, *tampered.turns[1:]]})
        fake = st.store.put_json(f"tampered/{st.tag}/trajectory.json", tampered)
        differs = await st.run(st.request(branch_of=parent.workflow_id, branch_turn=2, branch_record=fake))
        with pytest.raises(BranchRefused, match="out of range"):
            await start_branches(parent.workflow_id, 4, 1, client=st.client, store=st.store)
        with pytest.raises(LookupError, match="no workflow"):
            await start_branches(f"nobody-{st.tag}", 2, 1, client=st.client, store=st.store)

        async def grown():
            root = await tree(st.client, parent.workflow_id)
            return (root,) if root is not None and len(root.branches) == 5 else None

        [root] = await async_wait_for(grown, timeout_s=30, interval_s=0.3, what="the parent's tree")

        # `trajflow branch` as a user runs it, against this stack's server and store
        env = {
            **os.environ,
            "TRAJFLOW_TEMPORAL_ADDRESS": st.client.service_client.config.target_host,
            "TRAJFLOW_STORE_URL": Path(st.store.root).as_uri(),  # type: ignore[attr-defined]
            "TRAJFLOW_STATE_DIR": str(tmp_path / "state"),
        }
        trajflow = str(Path(sys.executable).parent / "trajflow")

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([trajflow, *args], env=env, capture_output=True, text=True, timeout=300)

        out = await asyncio.to_thread(cli, "branch", parent.workflow_id, "--turn", "3", "--n", "2", "--wait", "--json")
        bad = await asyncio.to_thread(cli, "branch", parent.workflow_id, "--turn", "9", "--n", "1")
        unknown = await asyncio.to_thread(cli, "branch", f"nobody-{st.tag}", "--turn", "2")

        async def all_seven():  # visibility is eventually consistent: the CLI's branches may show a moment late
            proc = await asyncio.to_thread(cli, "trajectories", "tree", parent.workflow_id, "--json")
            got = json.loads(proc.stdout)["branches"] if proc.returncode == 0 else []
            nested = sum(len(b["branches"]) for b in got)
            return (proc,) if len(got) == 7 and nested == 1 and "running" not in {b["status"] for b in got} else None

        [shown_tree] = await async_wait_for(all_seven, timeout_s=60, interval_s=1, what="7 branches in the CLI's tree")
        text_tree = await asyncio.to_thread(cli, "trajectories", "tree", parent.workflow_id)

    old = load(st.store, parent.trajectory_uri)
    branches = [load(st.store, r.trajectory_uri) for r in results]
    for r, rec in zip(results, branches, strict=True):
        assert r.status is TrajectoryStatus.COMPLETED and r.turns == 3, r
        assert rec.request.branch_of == parent.workflow_id and rec.request.branch_turn == K
        assert rec.request.seed == req.seed and rec.request.env_id == req.env_id
        assert rec.first_observation == old.first_observation
        assert rec.turns[: K - 1] == old.turns[: K - 1]  # the prefix: same actions, observations, versions
        # the same observation at turn k (the restored env showed it; it is the user message the branch answered)
        # and the parent's tokens through the end of turn k-1
        assert through_turn(rec, K) == through_turn(old, K)
    assert grandchild.status is TrajectoryStatus.COMPLETED and grandchild.turns == 3, grandchild
    assert load(st.store, grandchild.trajectory_uri).turns[:2] == branches[0].turns[:2]
    turn_k = [rec.turns[K - 1].action for rec in branches]
    assert turn_k == [guess(rec.request.sampling.seed, K - 1) for rec in branches]  # each samples with its own seed
    assert len({rec.request.sampling.seed for rec in branches}) == 3
    assert len(set(turn_k)) > 1, turn_k  # they sample differently from turn k
    assert {n.workflow_id for n in root.branches} >= {h.id for h in handles} and ui.workflow_id in {
        n.workflow_id for n in root.branches
    }
    assert {n.branch_turn for n in root.branches} == {1, K}
    assert ui.status is TrajectoryStatus.COMPLETED and ui.turns == 3
    ui_rec = load(st.store, ui.trajectory_uri)
    assert ui_rec.first_observation == old.first_observation and ui_rec.request.sampling.temperature == 1.0
    assert missing.status is TrajectoryStatus.FAILED and "no trajectory record" in (missing.error or ""), missing
    assert differs.status is TrajectoryStatus.FAILED, differs
    assert "the restored env's observation at turn 2 differs from the parent's" in (differs.error or ""), differs
    assert out.returncode == 0, out.stdout + out.stderr
    shown = json.loads(out.stdout)
    assert shown["turn"] == 3 and [b["status"] for b in shown["branches"]] == ["completed", "completed"], shown
    assert [b["turns"] for b in shown["branches"]] == [3, 3]
    cli_root = json.loads(shown_tree.stdout)
    assert cli_root["workflow_id"] == parent.workflow_id and cli_root["branch_turn"] is None
    at = sorted((b["branch_turn"], b["status"]) for b in cli_root["branches"])
    assert at == [(1, "completed"), *[(K, "completed")] * 3, (K, "failed"), *[(3, "completed")] * 2], at
    nested_at = [(b["workflow_id"], [g["branch_turn"] for g in b["branches"]]) for b in cli_root["branches"]]
    assert (handles[0].id, [3]) in nested_at and sum(len(g) for _, g in nested_at) == 1, nested_at
    lines = text_tree.stdout.splitlines()
    assert lines[0].startswith(parent.workflow_id) and all(x.startswith("  ") for x in lines[1:]), text_tree.stdout
    assert sum(x.startswith("  ") and "@turn 3  completed  reward" in x for x in lines) == 3, text_tree.stdout
    assert sum(x.startswith("    ") for x in lines) == 1, text_tree.stdout  # the branch of a branch, indented twice
    assert bad.returncode == 2 and "turn 9 is out of range" in bad.stdout, bad.stdout + bad.stderr
    assert unknown.returncode == 2 and "no workflow" in unknown.stdout, unknown.stdout + unknown.stderr


async def test_a_branch_that_loses_its_sandbox_is_restored_through_the_parents_turns_and_its_own(
    temporal_env, reward_service, store, sandbox_manager, seeded, docker_client
):
    from tests.integration.replay_helpers import SandboxKillingEngine

    engine = SandboxKillingEngine(seeded, sandbox_manager, docker_client, kill_at={4})  # the branch's 2nd turn
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as st:
        req = st.request(seed=6, max_turns=3, sampling=SamplingParams(temperature=1.0, seed=8))
        parent = await st.run(req)  # engine calls 0, 1, 2
        [handle] = await start_branches(parent.workflow_id, K, 1, client=st.client, store=st.store)
        engine.handle = handle
        result = await handle.result()
    assert engine.killed, "the branch's sandbox was never killed"
    assert result.status is TrajectoryStatus.COMPLETED and result.turns == 3 and result.env_recoveries == 1, result
    old, rec = load(st.store, parent.trajectory_uri), load(st.store, result.trajectory_uri)
    assert rec.turns[: K - 1] == old.turns[: K - 1] and through_turn(rec, K) == through_turn(old, K)
    # turn 2 is the branch's own (its seed's guess), and the restore replayed it: turn 3 went on from the branch's state
    assert rec.turns[K - 1].action == guess(rec.request.sampling.seed, K - 1)
    assert rec.turns[K].observation.startswith("At turn 3"), rec.turns[K].observation
