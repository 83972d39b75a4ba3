"""`[train] filter_flat_groups` (DAPO's dynamic sampling) through the real stack: the Temporal dev server, Docker
sandboxes running the guessing game, the reward service and the store. The policy is scripted by the sampling seed's
parity (a guess, reward 0 or 1, or no guess at all, reward -0.1), so about half of the groups of two are flat; the
trainer step is the simulated one. A direct and a sharded run drop every flat group, admit new seeds in their place,
train every step on groups with signal only and count the drops, never as lost; a run whose every group is flat
trains its steps on flat groups once a step's drops are spent."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from transformers import AutoTokenizer

from tests.conftest import async_wait_for, running_stack
from tests.integration.test_training_workflow import children, run_config
from trajflow.cli.replay.check import check, fetch
from trajflow.client import start_training, training_progress
from trajflow.contracts import names
from trajflow.contracts.shards import GroupManifest, shard_id
from trajflow.contracts.steps import is_flat
from trajflow.contracts.training import TrainingResult, TrainingState, TrainStepInput
from trajflow.contracts.trajectory import TrajectoryResult
from trajflow.infra import layout
from trajflow.infra.policies import PolicyStore
from trajflow.rl.engines.scripted import ScriptedEngine

pytestmark = pytest.mark.integration

GUESS, NO_GUESS = "\\boxed{5}", "I will not guess."


class SeedParityEngine(ScriptedEngine):
    """Guesses 5 when the request's sampling seed is even, answers without a box when it is odd: the rewards of a
    group of two differ exactly when its members' seeds differ in parity."""

    async def generate(self, prompt_ids, params, policy=""):
        self._script = [GUESS if (params.seed or 0) % 2 == 0 else NO_GUESS]
        return await super().generate(prompt_ids, params, policy)


@pytest.fixture()
def parity(tiny_model, store, tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    return SeedParityEngine(tok, GUESS, weights=PolicyStore(store, tmp_path / "policies", pointer_ttl_s=0.0))


async def steps_issued(client, run_id: str) -> list[TrainStepInput]:
    """Every train step's input, in the order the training workflow's runs scheduled them."""
    steps = []
    async for run in client.list_workflows(f"WorkflowId = '{run_id}'"):
        async for event in client.get_workflow_handle(run_id, run_id=run.run_id).fetch_history_events():
            if event.HasField("activity_task_scheduled_event_attributes"):
                attrs = event.activity_task_scheduled_event_attributes
                if attrs.activity_type.name == names.TRAIN_STEP:
                    steps.append(TrainStepInput.model_validate_json(attrs.input.payloads[0].data))
    return steps


async def rewards_by_group(client, run_id: str) -> dict[str, list[float]]:
    """Group name -> the rewards of its members that completed, from their results."""
    out: dict[str, list[float]] = {}
    for wf in await children(client, run_id):
        if wf.status.name == "COMPLETED":
            result = await client.get_workflow_handle(wf.id, result_type=TrajectoryResult).result()
            if result.reward is not None:
                out.setdefault(wf.id[len(run_id) + 1 :].rsplit("-", 1)[0], []).append(result.reward)
    return out


def trained_groups(store, steps: list[TrainStepInput]) -> dict[str, list[float]]:
    """Group name -> rewards of the samples a step trained on (a sharded step's from its groups' manifests)."""
    out: dict[str, list[float]] = {}
    for step in steps:
        refs = list(step.refs)
        for start, end in step.groups:
            for k in range(start, end):
                key = layout.group_manifest_key(step.run_id, k)
                refs += GroupManifest.model_validate(store.get_json(store.uri_for(key))).refs
        for ref in refs:
            out.setdefault(ref.group, []).append(ref.reward)
    return out


async def finished_run(st, cfg, prefix: str) -> tuple[str, TrainingResult, TrainingState]:
    run_id = f"{prefix}-{uuid.uuid4().hex[:8]}"
    handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)
    result = await asyncio.wait_for(handle.result(), timeout=300)
    state = await handle.query(names.QUERY_STATE, result_type=TrainingState)
    progress = await training_progress(handle)
    assert progress.counters.flat_groups_dropped == result.counters.flat_groups_dropped

    async def all_closed() -> bool:
        return all(w.status.name != "RUNNING" for w in await children(st.client, run_id))

    await async_wait_for(all_closed, timeout_s=60, what="every trajectory of the run to close")
    # the filter's decisions replay as they ran: the training workflow's history and, sharded, a shard's
    histories = [(run_id, await fetch(st.client, run_id))]
    if cfg.shard_groups():
        histories.append((shard_id(run_id, 0), await fetch(st.client, shard_id(run_id, 0))))
    assert [r.error for r in await check(histories)] == [None] * len(histories)
    return run_id, result, state


@pytest.mark.parametrize("groups_per_shard", [0, 2], ids=["direct", "sharded"])
async def test_flat_groups_are_dropped_replaced_and_counted(
    temporal_env, reward_service, store, sandbox_manager, parity, groups_per_shard: int
) -> None:
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, parity) as st:
        cfg = run_config(
            st.pools, steps=3, batch_size=4, group_size=2, alpha=1, filter_flat_groups=True,
            max_flat_groups_per_step=50, groups_per_shard=groups_per_shard,
        )  # fmt: skip
        run_id, result, state = await finished_run(st, cfg, "flat")
        steps = await steps_issued(st.client, run_id)
        trained = trained_groups(store, steps)
        completed = await rewards_by_group(st.client, run_id)

    c = result.counters
    assert result.version == 3 and len(steps) == 3 and c.consumed == 12
    assert len(trained) == 6 and all(len(r) == 2 and not is_flat(r) for r in trained.values()), trained
    # every complete flat group was dropped (the bound is far), none trained: the groups admitted beyond the 6
    # trained were flat ones' replacements, each a new seed (group k plays seed k)
    flat = {g for g, r in completed.items() if len(r) == 2 and is_flat(r)}
    assert flat and not flat & set(trained)
    assert c.flat_groups_dropped == len(flat) and c.flat_groups_trained == 0
    assert state.next_group >= 6 + len(flat)
    assert sum(r.flat_groups_dropped for r in result.history) <= c.flat_groups_dropped  # the rest: after the last
    # never counted as lost: nothing abandoned, stale or failed
    assert c.groups_abandoned == c.dropped_stale == c.failed == c.infra_failed == 0
    assert c.completed >= 2 * (6 + len(flat))


async def test_a_run_whose_every_group_is_flat_trains_flat_groups_past_the_steps_budget(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, tmp_path
) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model)
    always = ScriptedEngine(tok, GUESS, weights=PolicyStore(store, tmp_path / "always", pointer_ttl_s=0.0))
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, always) as st:
        cfg = run_config(
            st.pools, steps=3, batch_size=4, group_size=2, alpha=0, filter_flat_groups=True, max_flat_groups_per_step=1
        )
        _, result, state = await finished_run(st, cfg, "allflat")

    c = result.counters
    assert result.version == 3 and c.consumed == 12
    # each step: its first flat group dropped and replaced, then its budget of one spent, two flat groups trained
    assert [r.flat_groups_dropped for r in result.history] == [1, 1, 1]
    assert (c.flat_groups_dropped, c.flat_groups_trained) == (3, 6) and state.next_group == 9
