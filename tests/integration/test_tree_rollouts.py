"""Tree rollouts (`[train] rollout = { mode = "tree", roots = 2 }`) through the real stack: the Temporal dev server,
Docker sandboxes running GEM's GuessTheNumber, the reward service, the store, the simulated trainer step.

The policy guesses a number its request's sampling seed picks, out of the game's range, so every episode runs its
three turns and each turn (and each branch) samples visibly its own guess. A 2-step run with groups of 4 trains
each group on its 2 roots and 2 branches of them: each branch's parent is a root of its own group, its turn is in
2..3, its turns before it (actions and tokens) are its root's, and the run ends with the right counts; the training
workflow's history replays, also when it continued as new (every 50 events, α = 1 so that a tree group is open
across it) with its tree state carried over.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from transformers import AutoTokenizer

from tests.conftest import async_wait_for, running_stack
from tests.integration.test_dynamic_sampling import steps_issued
from tests.integration.test_training_workflow import children
from trajflow.cli.replay.check import check
from trajflow.client import start_training
from trajflow.contracts import names
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.rollouts import RolloutConfig
from trajflow.contracts.tasks import TaskConfig
from trajflow.contracts.training import TrainingRunConfig, TrainingStart
from trajflow.contracts.trajectory import SamplingParams, StagePools, TrajectoryResult
from trajflow.infra.policies import PolicyStore
from trajflow.rl.engines.scripted import ScriptedEngine

pytestmark = pytest.mark.integration


class SeedGuessEngine(ScriptedEngine):
    """Guesses 100..899 by the request's sampling seed: out of the easy game's range, so the episode goes on."""

    async def generate(self, prompt_ids, params, policy=""):
        self._script = [f"I guess \\boxed{{{100 + (params.seed or 0) % 800}}}"]
        return await super().generate(prompt_ids, params, policy)


@pytest.mark.parametrize("continue_every", [10_000, 50], ids=["one-run", "continued"])
async def test_a_tree_run_trains_groups_of_roots_and_their_branches(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, tmp_path, continue_every: int
) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model)
    engine = SeedGuessEngine(tok, "unused", weights=PolicyStore(store, tmp_path / "policies", pointer_ttl_s=0.0))
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as st:
        pools = StagePools(decode=st.pools, env=st.pools, reward=st.pools)
        task = TaskConfig(max_turns=3, sampling=SamplingParams(temperature=1.0, max_new_tokens=16), pools=pools)
        cfg = TrainingRunConfig(
            tasks=[task], trainer_pool=st.pools, steps=2, batch_size=4, group_size=4,
            alpha=0 if continue_every > 50 else 1, rollout=RolloutConfig(mode="tree", roots=2),
            history_events_before_continue=continue_every,
        )  # fmt: skip
        run_id = f"tree-{uuid.uuid4().hex[:8]}"
        handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)
        result = await asyncio.wait_for(handle.result(), timeout=300)

        async def all_closed() -> bool:
            return all(w.status.name != "RUNNING" for w in await children(st.client, run_id))

        await async_wait_for(all_closed, timeout_s=60, what="every trajectory of the run to close")
        wfs = await children(st.client, run_id)
        results = {w.id: await st.client.get_workflow_handle(w.id, result_type=TrajectoryResult).result() for w in wfs}
        attrs = {w.id: w.typed_search_attributes for w in wfs}
        # a step in flight when the run continued as new is issued again by the next run: one per version
        steps = list({step.version: step for step in await steps_issued(st.client, run_id)}.values())
        # every run of the training workflow replays (continued: runs that carried queued branches over)
        runs = [r.run_id async for r in st.client.list_workflows(f"WorkflowId = '{run_id}'")]
        histories = [(run_id, await st.client.get_workflow_handle(run_id, run_id=r).fetch_history()) for r in runs]
        replayed = await check(histories)

    c = result.counters
    assert result.version == 2 and len(steps) == 2 and c.consumed == 8
    assert c.started == c.completed == 8 and c.failed == c.infra_failed == c.groups_abandoned == 0
    assert [r.error for r in replayed] == [None] * len(runs)
    assert (len(runs) > 1) == (continue_every == 50)
    carried = [g for _, h in histories for g in _groups_carried(h)]
    # alpha 1: a group is open (tree state with it) when the run continues as new after a step
    assert (len(carried) > 0) == (continue_every == 50) and all(g is not None for g in carried), carried
    records = {wid: TrajectoryRecord.model_validate(store.get_json(r.trajectory_uri)) for wid, r in results.items()}
    for step in steps:
        [group] = {r.group for r in step.refs}
        members = [r.workflow_id for r in step.refs]
        assert len(members) == 4 and set(members) <= set(records)
        branches = [w for w in members if records[w].request.branch_of]
        roots = [w for w in members if w not in branches]
        assert len(roots) == 2 and len(branches) == 2, members
        assert all(len(records[w].turns) == 3 for w in roots)
        assert {records[w].request.branch_of for w in branches} == set(roots)  # one branch of each root
        for w in branches:
            req, parent = records[w].request, records[records[w].request.branch_of]
            k = req.branch_turn
            assert 2 <= k <= 3 and req.group == group
            assert attrs[w].get(_keyword(names.SA_BRANCH_OF)) == req.branch_of
            # the shared prefix: the root's turns 1..k-1 (actions, observations), token for token
            assert records[w].turns[: k - 1] == parent.turns[: k - 1]
            ctx, pctx = records[w].context, parent.context
            assert ctx is not None and pctx is not None
            end = pctx.turn_spans[k - 2][1]
            assert ctx.token_ids[:end] == pctx.token_ids[:end]


def _groups_carried(history) -> list[tuple[int, int, int] | None]:
    """(roots completed, branches started, branches queued) of each group a run's input carried over (None: no tree
    state)."""
    attrs = history.events[0].workflow_execution_started_event_attributes
    start = TrainingStart.model_validate_json(attrs.input.payloads[0].data)
    groups = start.resume.groups.values() if start.resume is not None else []
    return [(len(g.tree.roots), len(g.tree.branches), len(g.tree.queued)) if g.tree else None for g in groups]


def _keyword(name: str):
    from temporalio.common import SearchAttributeKey

    return SearchAttributeKey.for_keyword(name)
