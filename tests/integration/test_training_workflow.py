"""TrainingWorkflow against the real Temporal dev server, real Docker sandboxes and the real reward service.

These tests check the loop's bookkeeping (admission under α, the hard staleness bound, groups with
redundancy, the sync barrier, continue-as-new, worker restarts), so the policy is scripted and the trainer step
is the simulated one (a fixed sleep that still publishes versions). Real training is in test_training_real.py.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from transformers import AutoTokenizer

from tests.conftest import async_wait_for, pending_work, running_stack
from trajflow.client import start_training, training_progress
from trajflow.contracts import names
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.tasks import TaskConfig
from trajflow.contracts.training import TrainingRunConfig, TrainingState, TrainRef, TrainStepInput
from trajflow.contracts.trajectory import SamplingParams, StagePools, TrajectoryReport, TrajectoryStatus
from trajflow.infra.policies import PolicyStore
from trajflow.rl.engines.scripted import ScriptedEngine

pytestmark = pytest.mark.integration


def run_config(pools: str, **fields) -> TrainingRunConfig:
    task = TaskConfig(
        max_turns=1,
        sampling=SamplingParams(temperature=0.0, max_new_tokens=16),
        pools=StagePools(decode=pools, env=pools, reward=pools),
    )
    return TrainingRunConfig(tasks=[task], trainer_pool=pools, **fields)


@pytest.fixture()
def engine(tiny_model, store, tmp_path):
    """A scripted policy that stamps each turn with the run's newest published version."""
    tok = AutoTokenizer.from_pretrained(tiny_model)
    return ScriptedEngine(tok, "\\boxed{5}", weights=PolicyStore(store, tmp_path / "policies", pointer_ttl_s=0.0))


class GatedEngine(ScriptedEngine):
    """The scripted policy, holding every generation until the test opens the gate: trajectories stay running
    for as long as a test needs them to (to terminate some, or to continue as new around them)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate = asyncio.Event()
        self.waiting = 0

    async def generate(self, prompt_ids, params, policy=""):
        self.waiting += 1
        try:
            await self.gate.wait()
        finally:
            self.waiting -= 1
        return await super().generate(prompt_ids, params, policy)


@pytest.fixture()
def gated(tiny_model, store, tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    return GatedEngine(tok, "\\boxed{5}", weights=PolicyStore(store, tmp_path / "gated-policies", pointer_ttl_s=0.0))


async def trained(client, run_id: str, issued: dict[int, int] | None = None) -> dict[int, list[TrainRef]]:
    """What each step trained on (version before the step -> refs), from the train_step inputs in the history of
    every run of the workflow. A step issued again (after continue-as-new) must carry the same refs; `issued`
    counts how often each step was issued."""
    steps: dict[int, list[TrainRef]] = {}
    issued = {} if issued is None else issued
    async for run in client.list_workflows(f"WorkflowId = '{run_id}'"):
        async for event in client.get_workflow_handle(run_id, run_id=run.run_id).fetch_history_events():
            if event.HasField("activity_task_scheduled_event_attributes"):
                attrs = event.activity_task_scheduled_event_attributes
                if attrs.activity_type.name == "trainer.train_step":
                    step = TrainStepInput.model_validate_json(attrs.input.payloads[0].data)
                    issued[step.version] = issued.get(step.version, 0) + 1
                    assert steps.setdefault(step.version, step.refs) == step.refs, f"step v{step.version} differs"
    return steps


async def children(client, run_id: str) -> list:
    """Every trajectory the run started (its child workflows), from Temporal visibility."""
    out = []
    async for wf in client.list_workflows(f"WorkflowType = 'TrajectoryWorkflow' AND TrajflowRun = '{run_id}'"):
        out.append(wf)
    return out


async def test_async_run_respects_admission_and_staleness_bounds(
    temporal_env, reward_service, store, sandbox_manager, engine
) -> None:
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as st:
        cfg = run_config(st.pools, steps=3, batch_size=4, group_size=2, redundancy=1, alpha=1)
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)
        result = await asyncio.wait_for(handle.result(), timeout=240)
        state = await handle.query(names.QUERY_STATE, result_type=TrainingState)
        progress = await training_progress(handle)
        runs = await children(st.client, run_id)
        start_versions = {w.id: await _min_policy_version(st.client, w.id) for w in runs}

        async def all_closed():
            return all(w.status.name != "RUNNING" for w in await children(st.client, run_id))

        # cancelled redundant samples and leftovers end (cancelled), they do not run on or "recover"
        await async_wait_for(all_closed, timeout_s=60, what="every trajectory of the run to close")
        statuses = {w.status.name for w in await children(st.client, run_id)}
        assert statuses <= {"COMPLETED", "CANCELED"}, statuses

    c = result.counters
    assert result.version == 3 and len(result.history) == 3
    assert c.consumed == 12 and c.dropped_stale == 0
    assert all(0 <= lag <= 1 for step in result.history for lag in step.staleness)  # lag -> samples
    assert all(sum(step.staleness.values()) == step.trajectories == 4 for step in result.history)
    assert state.next_group >= 6
    assert len(runs) == c.started and c.started >= 6 * 3  # n + r = 3 started per group
    # admission: group k (n = 2 samples) may start only once (k + 1)·n <= (v + α + 1)·B at its start version v
    for wid, start_version in start_versions.items():
        k = int(wid.split("-g")[1].split("-")[0])
        assert (k + 1) * 2 <= (start_version + 1 + 1) * 4, f"group {k} started at v{start_version}"
    # redundancy: the first 2 complete samples make a group; the third is cancelled or arrives late
    assert c.cancelled + c.late >= 1
    assert progress.version == 3 and progress.counters.consumed == 12


async def _started_request(client, workflow_id: str):
    """The TrajectoryRequest a trajectory was started with, from its history's first event."""
    from trajflow.contracts.trajectory import TrajectoryRequest

    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.HasField("workflow_execution_started_event_attributes"):
            payload = event.workflow_execution_started_event_attributes.input.payloads[0]
            return TrajectoryRequest.model_validate_json(payload.data)
    raise AssertionError(f"{workflow_id} has no start event")


async def _min_policy_version(client, workflow_id: str) -> int:
    return (await _started_request(client, workflow_id)).min_policy_version


async def test_sync_mode_is_a_batch_barrier(temporal_env, reward_service, store, sandbox_manager, engine) -> None:
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as st:
        cfg = run_config(st.pools, steps=3, batch_size=4, group_size=2, alpha=0, sync=True)
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)
        result = await asyncio.wait_for(handle.result(), timeout=240)
        runs = await children(st.client, run_id)
    assert result.version == 3
    assert all(lag == 0 for step in result.history for lag in step.staleness)
    assert result.counters.started == 12 == len(runs)  # exactly B per step: nothing generated ahead
    # every trajectory of step s was generated by version s
    for wf in runs:
        k = int(wf.id.split("-g")[1].split("-")[0])
        assert await _min_policy_version(st.client, wf.id) == k // 2


async def test_stale_samples_are_dropped_never_trained(
    temporal_env, reward_service, store, sandbox_manager, engine
) -> None:
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, train_step_s=1.0) as st:
        cfg = run_config(st.pools, steps=4, batch_size=2, group_size=2, alpha=0)
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)

        async def at_v2():
            return (await training_progress(handle)).version >= 2

        await async_wait_for(at_v2, timeout_s=120, what="version 2")
        # a user-started group whose samples were generated by version 0: more than α = 0 behind
        for i in range(2):
            report = TrajectoryReport(
                workflow_id=f"user-traj-{i}",
                trajectory_uri="file:///nonexistent/never-read.json",
                group="user-group",
                policy_version=0,
                reward=1.0,
                status=TrajectoryStatus.COMPLETED,
            )
            await handle.signal(names.SIGNAL_TRAJECTORY_FINISHED, report)
        result = await asyncio.wait_for(handle.result(), timeout=240)
    assert result.counters.external == 2
    assert result.counters.dropped_stale == 2
    assert result.version == 4
    assert all(lag == 0 for step in result.history for lag in step.staleness)


async def test_continue_as_new_and_worker_restart_keep_the_run(
    temporal_env, reward_service, store, sandbox_manager, engine
) -> None:
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as st:
        tag = st.tag
        cfg = run_config(st.pools, steps=6, batch_size=2, group_size=2, alpha=1, history_events_before_continue=60)
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)

        async def at_v2():
            return (await training_progress(handle)).version >= 2

        await async_wait_for(at_v2, timeout_s=120, what="version 2")
    # every worker is gone now (mid-run); new ones on the same queues pick the run up where it was
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, tag=tag):
        try:
            result = await asyncio.wait_for(handle.result(), timeout=300)
        except TimeoutError:
            raise AssertionError(f"the run did not finish:\n{await pending_work(st.client, run_id)}") from None
        state = await handle.query(names.QUERY_STATE, result_type=TrainingState)
    assert result.version == 6
    assert result.counters.consumed == 12
    assert state.continued >= 1, "the history limit of 60 events should have forced continue-as-new"
    assert [s.step for s in result.history] == [1, 2, 3, 4, 5, 6]


async def test_a_run_continues_as_new_at_its_report_budget_whatever_its_history_length(
    temporal_env, reward_service, store, sandbox_manager, engine, monkeypatch
) -> None:
    """Temporal refuses a run's signals past 10,000, which a long history threshold would not prevent: the run
    continues as new once it has received `REPORTS_BEFORE_CONTINUE` reports (5,000; 3 here)."""
    from trajflow.contracts import capacity

    monkeypatch.setattr(capacity, "REPORTS_BEFORE_CONTINUE", 3)
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as st:
        cfg = run_config(st.pools, steps=3, batch_size=2, group_size=2, alpha=1)
        assert cfg.history_events_before_continue == 10_000  # never reached by 3 steps of 2
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)
        try:
            result = await asyncio.wait_for(handle.result(), timeout=300)
        except TimeoutError:
            raise AssertionError(f"the run did not finish:\n{await pending_work(st.client, run_id)}") from None
        state = await handle.query(names.QUERY_STATE, result_type=TrainingState)
    assert result.version == 3 and result.counters.consumed == 6
    assert [s.step for s in result.history] == [1, 2, 3]
    assert state.continued >= 1, "3 reports should have made the run continue as new"


async def test_a_dead_docker_engine_pauses_admission_and_a_live_one_resumes_it(
    temporal_env, reward_service, store, sandbox_manager, engine, docker_client, tmp_path
) -> None:
    """Systemic failure: with the env worker's Docker engine unreachable every reset fails. Admission stops
    after `pause_after_infra_failures` in a row instead of burning through the run; a probe group sent once
    the engine is back completes, admission resumes and the run finishes, training on no failed sample."""
    import docker

    from trajflow.sandbox.manager import SandboxManager

    gone = docker.DockerClient(base_url=f"unix://{tmp_path}/no-docker.sock", version=docker_client.api.api_version)
    dead = SandboxManager(gone, sandbox_manager.image, tmp_path / "sb", "test-dead-engine")
    async with running_stack(temporal_env, reward_service, store, dead, engine) as st:
        tag = st.tag
        cfg = run_config(
            st.pools, steps=2, batch_size=2, group_size=2, alpha=1, pause_after_infra_failures=3, pause_probe_s=3
        )
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)

        async def paused():
            return (await training_progress(handle)).paused

        reason = await async_wait_for(paused, timeout_s=120, what="admission to pause")
        assert "3 trajectories in a row failed on infrastructure" in reason
        assert "env.reset" in reason and "cannot start a container" in reason, reason
        desc = await handle.describe()
        assert desc.search_attributes.get("TrajflowStatus") == ["paused"]
        p = await training_progress(handle)
        assert p.counters.admission_pauses == 1 and p.counters.completed == 0 and p.version == 0
        # in flight when it paused: the first two groups (4 samples) and their replacements; nothing more
        # starts but the probe groups (one every 3, 6, 12... s)
        started_at_pause = p.counters.started
        await asyncio.sleep(4)
        assert (await training_progress(handle)).counters.started <= started_at_pause + 2

        # continue-as-new while paused, with replacements queued: the new run is paused with the same queue
        async def queued():
            state = await handle.query(names.QUERY_STATE, result_type=TrainingState)
            return state if state.replacements else None

        before = await async_wait_for(queued, timeout_s=60, what="replacements queued while paused")
        await handle.signal(names.SIGNAL_CONTINUE_AS_NEW)

        async def continued():
            state = await handle.query(names.QUERY_STATE, result_type=TrainingState)
            return state if state.continued == 1 else None

        after = await async_wait_for(continued, timeout_s=60, what="the run to continue as new")
        assert after.paused == before.paused
        # the queue carried over whole, unless a probe took from it meanwhile (and started members)
        assert after.replacements == before.replacements or after.counters.started > before.counters.started
    # the engine is back: workers with a live one on the same queues
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, tag=tag):
        try:
            result = await asyncio.wait_for(handle.result(), timeout=180)
        except TimeoutError:
            raise AssertionError(f"the run did not finish:\n{await pending_work(st.client, run_id)}") from None
    assert result.version == 2 and result.counters.consumed == 4
    assert result.counters.admission_pauses == 1
    assert result.counters.infra_failed >= 3
    assert (await handle.describe()).search_attributes.get("TrajflowStatus") == ["done"]


async def _running_members(client, run_id: str, group: str, count: int) -> list[str]:
    async def running():
        ids = [w.id for w in await children(client, run_id) if f"-{group}-" in w.id and w.status.name == "RUNNING"]
        return ids if len(ids) >= count else None

    return await async_wait_for(running, timeout_s=60, what=f"{count} running members of {group}")


async def test_sync_mode_replaces_an_abandoned_group(
    temporal_env, reward_service, store, sandbox_manager, gated
) -> None:
    """Defect: in sync mode (α = 0, the batch barrier) a group abandoned past max_group_restarts left its batch
    one group short and the barrier admitted nothing more: the run hung. Both members of one group are
    terminated here (ended without a report: infra failures) while every generation is held."""
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, gated) as st:
        cfg = run_config(st.pools, steps=1, batch_size=4, group_size=2, alpha=0, sync=True, max_group_restarts=0)
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)
        for wid in await _running_members(st.client, run_id, "g000001", 2):
            await st.client.get_workflow_handle(wid).terminate("test: a group that fails")

        async def abandoned():
            return (await training_progress(handle)).counters.groups_abandoned == 1

        await async_wait_for(abandoned, timeout_s=60, what="the group to be abandoned")
        gated.gate.set()
        try:
            result = await asyncio.wait_for(handle.result(), timeout=120)
        except TimeoutError:
            raise AssertionError(f"the run did not finish:\n{await pending_work(st.client, run_id)}") from None
        steps = await trained(st.client, run_id)
    assert result.version == 1 and result.counters.consumed == 4
    assert result.counters.groups_abandoned == 1 and result.counters.infra_failed == 2
    assert sorted({r.group for r in steps[0]}) == ["g000000", "g000002"]  # the replacement group, same batch


async def _task_of(client, workflow_id: str) -> str:
    return (await _started_request(client, workflow_id)).task


async def test_a_two_task_run_trains_on_both_tasks(
    temporal_env, reward_service, store, sandbox_manager, engine
) -> None:
    """Defect: weights 2:1 starved the lighter task once groups closed (sync mode: one group open at a time)."""
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as st:
        cfg = run_config(st.pools, steps=3, batch_size=2, group_size=2, alpha=0, sync=True)
        base = cfg.tasks[0]
        cfg = cfg.model_copy(update={"tasks": [base.model_copy(update={"name": "heavy", "weight": 2.0}),
                                               base.model_copy(update={"name": "light"})]})  # fmt: skip
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)
        result = await asyncio.wait_for(handle.result(), timeout=240)
        steps = await trained(st.client, run_id)
        tasks = [await _task_of(st.client, r.workflow_id) for v in sorted(steps) for r in steps[v]]
    assert result.version == 3 and result.counters.consumed == 6
    assert tasks.count("heavy") == 4 and tasks.count("light") == 2, tasks
    # each trained sample carries its task and whether it won (its last env reward at least 1, as its record says)
    refs = [r for v in sorted(steps) for r in steps[v]]
    for ref in refs:
        record = TrajectoryRecord.model_validate(store.get_json(ref.trajectory_uri))
        assert ref.task == record.request.task and ref.won == (record.turns[-1].env_reward >= 1.0), ref
    for name in ("heavy", "light"):
        mine = [r for r in refs if r.task == name]
        assert result.by_task[name].trajectories == len(mine) and result.by_task[name].wins == sum(r.won for r in mine)
    assert [sum(s.trajectories for s in step.by_task.values()) for step in result.history] == [2, 2, 2]


async def test_continue_as_new_while_a_step_trains_issues_the_step_again(
    temporal_env, reward_service, store, sandbox_manager, engine
) -> None:
    """Forced (the `continue_as_new` signal) while the trainer works: the state carries the step in flight, the
    next run issues it again and the trainer answers it once; every sample is trained once."""
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, train_step_s=3.0) as st:
        cfg = run_config(st.pools, steps=3, batch_size=2, group_size=2, alpha=1)
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)

        async def training():
            state = await handle.query(names.QUERY_STATE, result_type=TrainingState)
            return state.step is not None and state.version == 1

        await async_wait_for(training, timeout_s=120, what="the second step to be training")
        await handle.signal(names.SIGNAL_CONTINUE_AS_NEW)
        try:
            result = await asyncio.wait_for(handle.result(), timeout=180)
        except TimeoutError:
            raise AssertionError(f"the run did not finish:\n{await pending_work(st.client, run_id)}") from None
        state = await handle.query(names.QUERY_STATE, result_type=TrainingState)
        issued: dict[int, int] = {}
        steps = await trained(st.client, run_id, issued)
    assert state.continued == 1 and issued[1] == 2, issued  # issued in both runs, the same refs
    assert result.version == 3 and [r.step for r in result.history] == [1, 2, 3]
    wids = [r.workflow_id for v in steps for r in steps[v]]
    assert result.counters.consumed == 6 == len(wids) == len(set(wids))


async def test_a_child_inherited_through_continue_as_new_that_ends_unreported_is_noticed(
    temporal_env, reward_service, store, sandbox_manager, gated
) -> None:
    """A run that continued as new watches the children it inherited (their handles died with the old run): one
    terminated by hand is an infra failure of its group, replaced, and the run finishes, every sample counted
    once. Before, the group waited forever for the member's report."""
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, gated) as st:
        cfg = run_config(st.pools, steps=1, batch_size=2, group_size=2, alpha=0)
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)
        first, _ = await _running_members(st.client, run_id, "g000000", 2)
        await handle.signal(names.SIGNAL_CONTINUE_AS_NEW)

        async def continued():
            return (await handle.query(names.QUERY_STATE, result_type=TrainingState)).continued == 1

        await async_wait_for(continued, timeout_s=60, what="the run to continue as new")
        await st.client.get_workflow_handle(first).terminate("test: a trajectory that dies unreported")

        async def noticed():
            return (await training_progress(handle)).counters.infra_failed == 1

        await async_wait_for(noticed, timeout_s=60, what="the inherited child's end to be noticed")
        gated.gate.set()
        try:
            result = await asyncio.wait_for(handle.result(), timeout=120)
        except TimeoutError:
            raise AssertionError(f"the run did not finish:\n{await pending_work(st.client, run_id)}") from None
        steps = await trained(st.client, run_id)
    c = result.counters
    assert result.version == 1 and c.consumed == 2 and c.infra_failed == 1 and c.completed == 2
    wids = sorted(r.workflow_id for r in steps[0])
    # the survivor and the replacement (-2), not the dead one: which of -0 and -1 was terminated is the order the
    # visibility list gave them in, not fixed
    members = {f"{run_id}-g000000-{i}" for i in range(3)}
    assert first in members and wids == sorted(members - {first}), (first, wids)
