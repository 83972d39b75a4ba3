"""A sharded run's steps through the real Temporal dev server: a workflow saves group manifests with the reward pool's
`training.save_group` (the stub a shard calls), then has the real trainer (the tiny model, in this process) train on
group index ranges. Each step trains on the refs it carries plus its groups' samples (the same sequences, tokens, loss
and gradient norm as one process training on that batch; their order is tested in tests/unit/test_group_manifests.py),
returns the batch's figures counted by hand and publishes them in its step record; a step whose group has no manifest
fails at once, naming the group and its key."""

from __future__ import annotations

import random
import uuid
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from pydantic import BaseModel
from temporalio import workflow
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError, RetryState
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.integration.test_trainer_ranks import CONFIG, records, single_process
from trajflow.contracts import names
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.shards import BatchStats, GroupManifest
from trajflow.contracts.steps import TaskStats, TrainRef
from trajflow.contracts.training import TrainStepInput, TrainStepResult
from trajflow.infra.layout import group_manifest_key, step_key
from trajflow.infra.store import LocalStore

pytestmark = pytest.mark.integration


class GroupStepsInput(BaseModel):
    pool: str
    manifests: list[GroupManifest]
    steps: list[TrainStepInput]


class GroupStepsResult(BaseModel):
    uris: list[str]
    steps: list[TrainStepResult]


@workflow.defn(sandboxed=False)
class GroupSteps:
    """What a sharded run does around its trainer: shards save complete groups, the training workflow issues steps
    of group ranges."""

    @workflow.run
    async def run(self, inp: GroupStepsInput) -> GroupStepsResult:
        from trajflow.workflows import stubs

        uris = [await stubs.group_save(inp.pool, m) for m in inp.manifests]
        return GroupStepsResult(uris=uris, steps=[await stubs.train_step(inp.pool, step) for step in inp.steps])


def ref(rec: TrajectoryRecord, uri: str, group: str, reward: float, version: int, task: str, won: bool) -> TrainRef:
    return TrainRef(
        workflow_id=rec.workflow_id, trajectory_uri=uri, group=group, reward=reward, policy_version=version,
        task=task, won=won,
    )  # fmt: skip


async def test_steps_train_on_their_group_manifests(temporal_env, tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoConfig

    from trajflow.rewards.client import RewardClient
    from trajflow.workers.reward import reward_workers
    from trajflow.workers.trainer import trainer_workers

    store = LocalStore(tmp_path / "store")
    client, tag = temporal_env.client, uuid.uuid4().hex[:8]
    run_id, pool, queue = f"groups-{tag}", f"groups{tag}", f"test-groups-{tag}"
    recs = records(random.Random(11), 8, AutoConfig.from_pretrained(tiny_model).vocab_size)
    uris = [store.put_json(f"test/{run_id}/{r.workflow_id}.json", r) for r in recs]
    # (reward, policy version, task, won) of each record's ref: one user-started trajectory, then groups 0, 1 and 2
    figures = [
        (0.5, 0, "user", False),
        (1.0, 0, "t", True), (0.0, 0, "t", False),
        (1.0, 0, "t", True), (0.0, 0, "t", False), (0.5, 0, "t", False),
        (1.0, 0, "t", True), (0.25, 1, "t", False),
    ]  # fmt: skip
    members = {"user": [0], "g000000": [1, 2], "g000001": [3, 4, 5], "g000002": [6, 7]}
    refs = {g: [ref(recs[i], uris[i], g, *figures[i]) for i in idx] for g, idx in members.items()}
    manifests = [GroupManifest(run_id=run_id, k=k, refs=refs[f"g{k:06d}"]) for k in range(3)]
    steps = [
        TrainStepInput(run_id=run_id, version=0, refs=refs["user"], trainer=CONFIG, groups=[(0, 2)]),
        TrainStepInput(run_id=run_id, version=1, refs=[], trainer=CONFIG, groups=[(2, 3)]),
    ]
    reward_client = RewardClient("http://127.0.0.1:9", timeout_s=1)  # saving groups never scores
    work = tmp_path / "trainer"
    workers = reward_workers(client, reward_client, store, [pool])
    workers += trainer_workers(client, store, tiny_model, work, [pool], work / "cache")
    workers.append(
        Worker(client, task_queue=queue, workflows=[GroupSteps], workflow_runner=UnsandboxedWorkflowRunner())
    )
    try:
        async with AsyncExitStack() as running:
            for worker in workers:
                await running.enter_async_context(worker)
            done = await client.execute_workflow(
                GroupSteps.run, GroupStepsInput(pool=pool, manifests=manifests, steps=steps), id=run_id,
                task_queue=queue, result_type=GroupStepsResult,
            )  # fmt: skip
            missing = TrainStepInput(run_id=run_id, version=2, refs=[], trainer=CONFIG, groups=[(2, 4)])
            with pytest.raises(WorkflowFailureError) as failed:
                await client.execute_workflow(
                    GroupSteps.run, GroupStepsInput(pool=pool, manifests=[], steps=[missing]), id=f"{run_id}-missing",
                    task_queue=queue, result_type=GroupStepsResult,
                )  # fmt: skip
    finally:
        await reward_client.close()

    assert done.uris == [store.uri_for(group_manifest_key(run_id, k)) for k in range(3)]
    assert [GroupManifest.model_validate(store.get_json(u)) for u in done.uris] == manifests
    first, second = done.steps
    assert (first.version, second.version) == (1, 2)
    assert first.batch == BatchStats(
        trajectories=6,
        reward_mean=0.5,  # (0.5 + 1 + 0 + 1 + 0 + 0.5) / 6
        wins=2,
        staleness={0: 6},
        by_task={
            "user": TaskStats(trajectories=1, reward_mean=0.5, wins=0),
            "t": TaskStats(trajectories=5, reward_mean=0.5, wins=2),
        },
    )
    assert second.batch == BatchStats(
        trajectories=2,
        reward_mean=0.625,
        wins=1,
        staleness={0: 1, 1: 1},  # trained at v1: lags 1 - 0 and 1 - 1
        by_task={"t": TaskStats(trajectories=2, reward_mean=0.625, wins=1)},
    )
    for result in done.steps:  # the record a retried step answers with carries them too
        assert TrainStepResult.model_validate(store.get_json(store.uri_for(step_key(run_id, result.version)))) == result

    # what one process makes of the same batches, the user's sample first, then the groups' in group order
    batches = [recs[0:6], recs[6:8]]
    combined = [
        steps[0].model_copy(update={"refs": refs["user"] + refs["g000000"] + refs["g000001"], "groups": []}),
        steps[1].model_copy(update={"refs": refs["g000002"], "groups": []}),
    ]
    _, expected = single_process(tiny_model, batches, combined)
    assert [r.metrics["sequences"] for r in done.steps] == [6.0, 2.0]
    for result, reference in zip(done.steps, expected, strict=True):
        assert result.metrics["sequences"] == reference["sequences"]
        assert result.metrics["tokens"] == reference["tokens"]
        assert result.metrics["loss"] == pytest.approx(reference["loss"], rel=1e-5, abs=1e-7)
        assert result.metrics["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-5)
        assert 0 < result.metrics["load_s"] < result.seconds  # the step's store reads, timed apart

    activity_error = failed.value.cause
    assert isinstance(activity_error, ActivityError)
    assert activity_error.retry_state == RetryState.NON_RETRYABLE_FAILURE  # one attempt, not retried
    error = activity_error.cause
    assert isinstance(error, ApplicationError) and error.type == names.ERR_BAD_REQUEST
    assert "g000003" in error.message and group_manifest_key(run_id, 3) in error.message
