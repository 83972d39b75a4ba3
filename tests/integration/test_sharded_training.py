"""A sharded TrainingWorkflow (`[train] groups_per_shard`) against the real Temporal dev server, real Docker
sandboxes, the real reward service and store: shards start the trajectories, write each complete group's manifest
to the store and report one message a group; the training workflow trains on group ranges and holds no
trajectory's entry. The policy is scripted and the trainer step the simulated one (it reads the manifests)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from transformers import AutoTokenizer

from tests.conftest import async_wait_for, running_stack
from tests.integration.test_training_workflow import children, run_config
from trajflow.client import start_training
from trajflow.contracts import names
from trajflow.contracts.shards import GroupManifest
from trajflow.contracts.training import TrainingState, TrainStepInput
from trajflow.infra import layout
from trajflow.infra.policies import PolicyStore
from trajflow.lab.chaos.audit import audit, collect
from trajflow.rl.engines.scripted import ScriptedEngine

pytestmark = pytest.mark.integration


@pytest.fixture()
def engine(tiny_model, store, tmp_path):
    """A scripted policy that stamps each turn with the run's newest published version."""
    tok = AutoTokenizer.from_pretrained(tiny_model)
    return ScriptedEngine(tok, "\\boxed{5}", weights=PolicyStore(store, tmp_path / "policies", pointer_ttl_s=0.0))


async def steps_issued(client, run_id: str) -> dict[int, TrainStepInput]:
    """Every train step's input (version before the step -> input), from the histories of every run of the workflow;
    a step issued again (after continue-as-new) must carry the same groups."""
    steps: dict[int, TrainStepInput] = {}
    async for run in client.list_workflows(f"WorkflowId = '{run_id}'"):
        async for event in client.get_workflow_handle(run_id, run_id=run.run_id).fetch_history_events():
            if event.HasField("activity_task_scheduled_event_attributes"):
                attrs = event.activity_task_scheduled_event_attributes
                if attrs.activity_type.name == names.TRAIN_STEP:
                    step = TrainStepInput.model_validate_json(attrs.input.payloads[0].data)
                    assert steps.setdefault(step.version, step) == step, f"step v{step.version} issued differently"
    return steps


async def shards(client, run_id: str) -> list:
    out = []
    async for wf in client.list_workflows(f"WorkflowType = '{names.SHARD_WORKFLOW}' AND TrajflowRun = '{run_id}'"):
        out.append(wf)
    return out


@pytest.mark.parametrize("continue_every", [10_000, 50], ids=["one-run", "continuing-as-new"])
async def test_a_sharded_run_trains_every_step_on_whole_groups_from_the_store(
    temporal_env, reward_service, store, sandbox_manager, engine, continue_every: int
) -> None:
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as st:
        cfg = run_config(
            st.pools,
            steps=3,
            batch_size=4,
            group_size=2,
            redundancy=1,
            alpha=1,
            groups_per_shard=2,
            history_events_before_continue=continue_every,
        )
        run_id = f"shrd-{uuid.uuid4().hex[:8]}"
        handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)
        result = await asyncio.wait_for(handle.result(), timeout=300)
        state = await handle.query(names.QUERY_STATE, result_type=TrainingState)
        steps = await steps_issued(st.client, run_id)

        async def all_closed() -> bool:
            return all(
                w.status.name != "RUNNING" for w in await children(st.client, run_id) + await shards(st.client, run_id)
            )

        await async_wait_for(all_closed, timeout_s=90, what="every trajectory and shard of the run to close")
        trajectories = await children(st.client, run_id)
        shard_runs = await shards(st.client, run_id)
        # the chaos audit reads a sharded step's groups as the trainer does: every sample trained once, none lost
        audited = audit(await collect(st.client, store, run_id, result.version, cfg.steps, result.counters.started))

    c = result.counters
    assert result.version == 3 and [r.step for r in result.history] == [1, 2, 3]
    assert c.consumed == 12 and c.dropped_stale == 0 and c.groups_abandoned == 0
    assert all(r.trajectories == 4 and sum(r.staleness.values()) == 4 for r in result.history)
    if continue_every == 50:
        assert state.continued >= 1
    # the training workflow never saw a trajectory: its steps name groups, whose manifests the shards wrote
    assert sorted(steps) == [0, 1, 2] and all(not s.refs and s.groups for s in steps.values())
    trained = [k for s in steps.values() for start, end in s.groups for k in range(start, end)]
    assert len(trained) == len(set(trained)) == 6, trained  # 2 groups a step, none trained twice
    assert state.sharded is not None and not state.sharded.shards and not state.sharded.open
    assert state.groups == {} and not state.to_cancel
    for k in trained:
        manifest = GroupManifest.model_validate(store.get_json(store.uri_for(layout.group_manifest_key(run_id, k))))
        assert manifest.k == k and len(manifest.refs) == 2
        assert all(r.workflow_id.startswith(f"{run_id}-g{k:06d}-") for r in manifest.refs)
    # the shards were the trajectories' parents: each trajectory is one shard's, counted once
    assert len(shard_runs) == state.next_group // 2 >= 3  # shards of 2 groups, one a shard's worth of budget
    assert {w.status.name for w in shard_runs} <= {"COMPLETED", "CANCELED"}
    assert len(trajectories) == c.started and c.started >= 6 * 3
    assert {w.status.name for w in trajectories} <= {"COMPLETED", "CANCELED"}
    assert c.completed >= 12 and c.failed == c.infra_failed == 0
    assert c.started == c.completed + c.cancelled, c  # the redundant and the leftover members counted cancelled
    assert audited.ok and audited.consumed == 12 and audited.lost == 0, audited


async def test_a_terminated_shard_loses_its_groups_not_the_run(
    temporal_env, reward_service, store, sandbox_manager, engine
) -> None:
    """A shard terminated by hand never reports: the training workflow writes its groups off and admission fills
    the run with new ones, so the run still trains every step."""
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, train_step_s=1.0) as st:
        cfg = run_config(st.pools, steps=3, batch_size=4, group_size=2, alpha=1, groups_per_shard=2)
        run_id = f"shrd-{uuid.uuid4().hex[:8]}"
        handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)
        first = f"{run_id}-s000000"

        async def started() -> bool:
            return any(w.id == first for w in await shards(st.client, run_id))

        await async_wait_for(started, timeout_s=60, what="the run's first shard")
        await st.client.get_workflow_handle(first).terminate("test: a shard lost")
        result = await asyncio.wait_for(handle.result(), timeout=300)
        steps = await steps_issued(st.client, run_id)

    trained = [k for s in steps.values() for start, end in s.groups for k in range(start, end)]
    assert result.version == 3 and result.counters.consumed == 12
    assert len(trained) == len(set(trained)) == 6
    # the terminated shard's groups were written off, unless they had reported before it ended
    assert result.counters.groups_abandoned + len({0, 1} & set(trained)) == 2
