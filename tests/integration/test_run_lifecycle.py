"""Ending a training run early, against the real Temporal dev server, Docker sandboxes and the reward service: the
`stop` signal (graceful and now), a cancel and a terminate from a client, as the Temporal UI or CLI would send them.
Every way must leave none of the run's trajectories running, counted through visibility, in a direct run and in a
sharded one (`groups_per_shard`: its shard workflows must end too).

The policy is scripted and held at a gate (`GatedEngine`), so trajectories stay running until the test lets them
go; the trainer step is the simulated one.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import CancelledError

from tests.conftest import async_wait_for, running_stack
from tests.integration.test_training_workflow import GatedEngine, run_config
from tests.integration.test_training_workflow import gated as gated  # the fixture
from trajflow.client import start_training, stop_training
from trajflow.contracts import names
from trajflow.contracts.training import TrainingState
from trajflow.workers.run_sweep import sweep_once

pytestmark = pytest.mark.integration


async def running_count(client, run_id: str, kind: str = names.TRAJECTORY_WORKFLOW) -> int:
    """The run's trajectories (or shard workflows) that visibility says are running."""
    query = f"WorkflowType = '{kind}' AND {names.SA_RUN} = '{run_id}' AND ExecutionStatus = 'Running'"
    return (await client.count_workflows(query)).count


@pytest.fixture(params=[0, 1], ids=["direct", "sharded"])
def groups_per_shard(request) -> int:
    """Each test runs on a direct run and on a sharded one (shards of one group)."""
    return request.param


async def wait_running(client, run_id: str, at_least: int) -> None:
    async def enough() -> bool:
        return await running_count(client, run_id) >= at_least

    await async_wait_for(enough, timeout_s=90, what=f"{at_least} running trajectories of {run_id}")


async def wait_none_running(client, run_id: str, timeout_s: float = 60) -> None:
    async def none() -> bool:
        return await running_count(client, run_id) == await running_count(client, run_id, names.SHARD_WORKFLOW) == 0

    await async_wait_for(none, timeout_s=timeout_s, interval_s=0.5, what=f"no running trajectory of {run_id}")


async def started_and_held(st, groups_per_shard: int) -> tuple[str, WorkflowHandle]:
    """A run of 5 steps of B = 2 in groups of 2 at α = 1, once its (α + 1)·B = 4 samples run, held at the gate."""
    cfg = run_config(st.pools, steps=5, batch_size=2, group_size=2, alpha=1, groups_per_shard=groups_per_shard)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)
    await wait_running(st.client, run_id, 4)
    return run_id, handle


async def test_a_graceful_stop_trains_the_current_step_then_ends_every_trajectory(
    temporal_env, reward_service, store, sandbox_manager, gated: GatedEngine, groups_per_shard: int
) -> None:
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, gated) as st:
        run_id, handle = await started_and_held(st, groups_per_shard)
        await stop_training(run_id, reason="enough for today", client=st.client)
        admitted = (await handle.query(names.QUERY_STATE, result_type=TrainingState)).next_group
        gated.gate.set()
        result = await asyncio.wait_for(handle.result(), timeout=180)
        state = await handle.query(names.QUERY_STATE, result_type=TrainingState)
        await wait_none_running(st.client, run_id)
        status = (await handle.describe()).search_attributes.get(names.SA_STATUS)
    assert result.version == 1 and result.counters.consumed == 2  # the current step, and no other
    c = result.counters
    assert c.started == c.completed + c.failed + c.infra_failed + c.cancelled, c  # the rest cancelled, and counted
    assert result.stopped == "enough for today at v1 (graceful)"
    assert state.next_group == admitted  # nothing admitted after the stop
    assert status == ["stopped"]


async def test_stop_now_cancels_what_runs_without_training_more(
    temporal_env, reward_service, store, sandbox_manager, gated: GatedEngine, groups_per_shard: int
) -> None:
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, gated) as st:
        run_id, handle = await started_and_held(st, groups_per_shard)
        await stop_training(run_id, now=True, client=st.client)
        result = await asyncio.wait_for(handle.result(), timeout=120)
        await wait_none_running(st.client, run_id)  # the gate never opened: they were cancelled
    assert result.version == 0 and result.counters.consumed == 0
    assert result.stopped == "stopped by request at v0 (now)"
    # a sharded run's members are cancelled by their shards, whose last messages count them
    assert result.counters.cancelled >= 4, result.counters
    c = result.counters
    assert c.started == c.completed + c.failed + c.infra_failed + c.cancelled, c  # every one accounted for


async def test_a_cancelled_run_cancels_its_trajectories(
    temporal_env, reward_service, store, sandbox_manager, gated: GatedEngine, groups_per_shard: int
) -> None:
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, gated) as st:
        run_id, handle = await started_and_held(st, groups_per_shard)
        await handle.cancel()  # what the UI's Request Cancellation and `temporal workflow cancel` send
        with pytest.raises(WorkflowFailureError) as ended:
            await asyncio.wait_for(handle.result(), timeout=60)
        await wait_none_running(st.client, run_id)
        status = (await handle.describe()).search_attributes.get(names.SA_STATUS)
    assert isinstance(ended.value.cause, CancelledError)
    assert status == ["cancelled"]


async def test_the_sweep_ends_the_trajectories_of_a_terminated_run_and_only_those(
    temporal_env, reward_service, store, sandbox_manager, gated: GatedEngine, groups_per_shard: int
) -> None:
    """A terminated run runs no code: the orchestrator's sweep (workers/run_sweep.py) cancels its trajectories (and
    a sharded run's shards), and leaves those of a run that is still running alone. The live run's trajectories
    are the newest, so they come first in visibility's listing, and they fill a page: the sweep still finds the
    others (it once read one page, and a run with more in flight than a page hid the ended ones)."""
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, gated) as st:
        cfg = run_config(st.pools, steps=5, batch_size=2, group_size=2, alpha=0, groups_per_shard=groups_per_shard)
        doomed, alive = (f"run-{uuid.uuid4().hex[:8]}" for _ in range(2))
        handles = {}
        for r in (doomed, alive):  # one after the other: the live run's trajectories started last
            handles[r] = await start_training(cfg, run_id=r, client=st.client, task_queue=st.queue)
            await wait_running(st.client, r, 2)
        await handles[doomed].terminate("test: what `temporal workflow terminate` does")
        assert await running_count(st.client, doomed) == 2  # nothing of the run itself ends them

        async def swept() -> bool:
            await sweep_once(st.client, page=1)
            return await running_count(st.client, doomed) == 0

        await async_wait_for(
            swept, timeout_s=60, interval_s=1.0, what="the sweep to end the terminated run's trajectories"
        )
        await wait_none_running(st.client, doomed)
        assert await running_count(st.client, alive) == 2
        await handles[alive].terminate("test: done")
