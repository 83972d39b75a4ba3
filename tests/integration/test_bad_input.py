"""Bad input ends in a clear, non-retryable error and loses nothing (issue 5): against the real Temporal dev server.

Workflows are started the way the Temporal UI and `temporal workflow start` start them: plain JSON (or raw bytes)
through a client. Each case asserts that the workflow ends within a bound (FAILED, or a trajectory that ends
`failed`), that the error is non-retryable and says what to fix, and that nothing was left retrying: no
workflow-task failure in the history, one attempt of the activity at fault.

Covered here: malformed JSON, wrong types and unknown fields for both workflows, an invalid training config, an
oversized start and input, no input (defaults), input our own code wrote (still a task failure, so a fix can
resume it), malformed `trajectory_finished` signals, and, with fake activities under the real names, an activity
result and an activity input over the payload limit. Real Docker and the real reward service: an unknown env id,
a reward service that answers garbage, an agent that prints 10 MB (tests/integration/test_bad_input_stack.py).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowHandle, WorkflowQueryFailedError
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from tests.conftest import async_wait_for
from trajflow.contracts import names
from trajflow.contracts.scoring import ScoreInput, ScoreResult
from trajflow.contracts.training import TrainingProgress
from trajflow.contracts.trajectory import (
    EnvCloseInput,
    EnvResetInput,
    EnvResetResult,
    EnvStepInput,
    EnvStepResult,
    GenerateInput,
    GenerateResult,
    SandboxHandle,
    SaveTrajectoryInput,
    SaveTrajectoryResult,
    StagePools,
    TrajectoryReport,
    TrajectoryRequest,
    TrajectoryResult,
    TrajectoryStatus,
)

pytestmark = pytest.mark.integration

BOUND_S = 30.0
"""Every bad start must be closed within this long."""


def raw_json(data: bytes) -> RawValue:
    """A payload exactly as sent, even when it is not JSON at all."""
    return RawValue(Payload(metadata={"encoding": b"json/plain"}, data=data))


@asynccontextmanager
async def orchestrator(temporal_env) -> AsyncIterator[str]:
    """The real workflow worker on a fresh queue (no activity workers: these workflows must not get that far)."""
    from trajflow.workers.orchestrator import orchestrator_workers

    queue = f"bad-input-{uuid.uuid4().hex[:8]}"
    [worker] = orchestrator_workers(temporal_env.client, queue)
    async with worker:
        yield queue


async def closed(handle: WorkflowHandle, timeout_s: float = BOUND_S) -> str:
    """The workflow's status once it is no longer running (fails after timeout_s)."""

    async def status() -> str | None:
        desc = await handle.describe()
        return None if desc.status is None or desc.status.name == "RUNNING" else desc.status.name

    return await async_wait_for(status, timeout_s, 0.2, f"{handle.id} to close")


async def task_failures(handle: WorkflowHandle) -> list[str]:
    """The messages of every workflow-task failure in the history: a workflow retrying bad input shows them."""
    history = await handle.fetch_history()
    return [
        e.workflow_task_failed_event_attributes.failure.message
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]


async def failure(handle: WorkflowHandle) -> ApplicationError:
    with pytest.raises(WorkflowFailureError) as info:
        await handle.result()
    cause = info.value.cause
    assert isinstance(cause, ApplicationError), cause
    return cause


async def activity_attempts(handle: WorkflowHandle, name: str) -> int:
    """How many times activity `name` was started (a retry is a start with a higher attempt)."""
    history = await handle.fetch_history()
    scheduled = {
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == name
    }
    return sum(
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.scheduled_event_id in scheduled
    )


BAD_TRAJECTORY_INPUTS = [
    pytest.param(raw_json(b'{"seed": 1,,}'), ["Invalid JSON", "one JSON object"], id="malformed-json"),
    pytest.param({"seed": "abc"}, ["seed: Input should be a valid integer", "(got 'abc')"], id="wrong-type"),
    pytest.param(
        {"bogus": 1},
        ["bogus: not a field", "known fields: branch_index, branch_of, branch_record, branch_turn, env_id"],
        id="unknown-field",
    ),
    pytest.param(
        {"sampling": {"temperature": "hot"}}, ["sampling.temperature: Input should be a valid number"], id="nested"
    ),
    pytest.param([1, 2], ["Input should be an object", "use {} for every default"], id="not-an-object"),
    pytest.param(
        {"env_id": "GuessTheNumber"}, ["env_id: 'GuessTheNumber' is not an env id", "game:"], id="env-id-form"
    ),
    pytest.param({"pools": {"env": ""}}, ["pools.env: String should have at least 1 character"], id="empty-pool"),
    pytest.param({"reward_fn": "model:rm"}, ["reward_fn 'model:rm' needs the model's spec"], id="model-without-spec"),
    pytest.param(
        {"system_prompt": "x" * 1_000_000},
        ["system_prompt: String should have at most 32000 characters", "a str of 1000000"],
        id="1MB-prompt",
    ),
]


@pytest.mark.parametrize(("payload", "expected"), BAD_TRAJECTORY_INPUTS)
async def test_a_trajectory_started_with_bad_input_fails_at_once_saying_what_to_fix(
    temporal_env, payload, expected
) -> None:
    async with orchestrator(temporal_env) as queue:
        t0 = time.monotonic()
        handle = await temporal_env.client.start_workflow(
            names.TRAJECTORY_WORKFLOW, payload, id=f"bad-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        assert await closed(handle) == "FAILED"
        err = await failure(handle)
        print(f"\n{time.monotonic() - t0:.2f}s {err.type}: {err.message[:300]}")
        assert err.type == names.ERR_INVALID_INPUT and err.non_retryable
        assert err.message.startswith("TrajectoryRequest: ") and err.message.endswith("— fix the workflow input")
        for fragment in expected:
            assert fragment in err.message
        assert len(err.message) < 2100  # a 1 MB input is summarised, never echoed into history
        assert await task_failures(handle) == []


BAD_TRAINING_INPUTS = [
    pytest.param(
        {"run": {"batch_size": 6, "group_size": 4}},
        ["batch_size (6) must be a multiple of group_size (4)"],
        id="batch-vs-group",
    ),
    pytest.param({"run": {"steps": "many"}}, ["run.steps: Input should be a valid integer"], id="wrong-type"),
    pytest.param({"run": {"sync": True, "alpha": 2}}, ["sync mode is the alpha = 0 barrier"], id="sync-alpha"),
    pytest.param(
        {"run": {"tasks": [{"env_id": "nosuch"}]}}, ["run.tasks.0.env_id: 'nosuch' is not an env id"], id="task-env"
    ),
    pytest.param(
        {"run": {"tasks": [{"bogus": 1}]}}, ["run.tasks.0.bogus: not a field", "known fields: env_id"], id="task-field"
    ),
    pytest.param(
        {"run": {"trainer_pool": "no such pool"}}, ["run.trainer_pool: String should match pattern"], id="pool-name"
    ),
    pytest.param({"run": {"tasks": []}}, ["run.tasks: List should have at least 1 item"], id="no-tasks"),
    pytest.param(raw_json(b"steps = 3"), ["Invalid JSON"], id="toml-not-json"),
]


@pytest.mark.parametrize(("payload", "expected"), BAD_TRAINING_INPUTS)
async def test_a_training_run_started_with_an_invalid_config_fails_at_once_saying_what_to_fix(
    temporal_env, payload, expected
) -> None:
    async with orchestrator(temporal_env) as queue:
        handle = await temporal_env.client.start_workflow(
            names.TRAINING_WORKFLOW, payload, id=f"bad-run-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        assert await closed(handle) == "FAILED"
        err = await failure(handle)
        print(f"\n{err.type}: {err.message[:300]}")
        assert err.type == names.ERR_INVALID_INPUT and err.non_retryable
        assert err.message.startswith("TrainingStart: ")
        for fragment in expected:
            assert fragment in err.message
        assert await task_failures(handle) == []


async def test_an_oversized_start_is_refused_by_the_server_and_nothing_starts(temporal_env) -> None:
    wid = f"huge-{uuid.uuid4().hex[:8]}"
    with pytest.raises(RPCError) as info:
        await temporal_env.client.start_workflow(
            names.TRAJECTORY_WORKFLOW, {"system_prompt": "x" * 3_000_000}, id=wid, task_queue="nobody-polls-this"
        )
    assert info.value.status == RPCStatusCode.INVALID_ARGUMENT and "size exceeds limit" in info.value.message
    with pytest.raises(RPCError) as missing:
        await temporal_env.client.get_workflow_handle(wid).describe()
    assert missing.value.status == RPCStatusCode.NOT_FOUND


async def test_no_input_at_all_runs_the_defaults(temporal_env) -> None:
    """A start with no input is `{}`, as the UI's form promises (before, the workflow task failed forever)."""
    async with orchestrator(temporal_env) as queue:
        handle = await temporal_env.client.start_workflow(
            names.TRAJECTORY_WORKFLOW, id=f"empty-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        try:
            progress = await async_wait_for(lambda: _progress(handle), BOUND_S, 0.2, "the progress query")
            assert progress["env_id"] == TrajectoryRequest().env_id and progress["turn"] == 0
            # waiting for an env worker of the default pool, which this test does not run: not failing
            desc = await handle.describe()
            assert desc.status is not None and desc.status.name == "RUNNING"
            assert [a.activity_type.name for a in desc.raw_description.pending_activities] == [names.ENV_RESET]
            assert await task_failures(handle) == []
        finally:
            await handle.terminate("test over")


async def _progress(handle: WorkflowHandle) -> dict | None:
    try:
        return await handle.query(names.QUERY_PROGRESS)
    except (RPCError, WorkflowQueryFailedError):
        return None  # its first workflow task has not run yet


@workflow.defn(name="BadInputParent", sandboxed=False)
class BadInputParent:
    """Starts a TrajectoryWorkflow child with input our own code should never write (a bug, a version skew)."""

    @workflow.run
    async def run(self, queue: str) -> None:
        await workflow.execute_child_workflow(
            names.TRAJECTORY_WORKFLOW, {"seed": "abc"}, id=f"{workflow.info().workflow_id}-child", task_queue=queue
        )


async def test_input_our_own_code_wrote_still_fails_the_task_so_a_fix_can_resume_it(temporal_env) -> None:
    client = temporal_env.client
    parent_queue = f"bad-parent-{uuid.uuid4().hex[:8]}"
    async with orchestrator(temporal_env) as queue, Worker(client, task_queue=parent_queue, workflows=[BadInputParent]):
        parent = await client.start_workflow(
            "BadInputParent", queue, id=f"parent-{uuid.uuid4().hex[:8]}", task_queue=parent_queue
        )
        child = client.get_workflow_handle(f"{parent.id}-child")
        try:
            failures = await async_wait_for(
                lambda: _child_task_failures(child), BOUND_S, 0.2, "the child's task failure"
            )
            assert "input written by this workflow's own code does not decode" in failures[0]
            assert "seed: Input should be a valid integer" in failures[0]
            assert (await child.describe()).status.name == "RUNNING"  # waiting for a fixed worker, not failed
        finally:
            await parent.terminate("test over")  # the child goes with it (parent close policy: terminate)


async def _child_task_failures(child: WorkflowHandle) -> list[str]:
    try:
        return await task_failures(child)
    except RPCError:
        return []  # not started yet


async def test_malformed_trajectory_finished_signals_are_dropped_with_a_warning_and_the_run_goes_on(
    temporal_env, caplog
) -> None:
    client = temporal_env.client
    pool = f"unserved{uuid.uuid4().hex[:6]}"  # nobody serves it: the run's own trajectories wait, harmlessly
    run = {
        "steps": 1,
        "batch_size": 1,
        "group_size": 1,
        "trainer_pool": pool,
        "tasks": [{"pools": {"decode": pool, "env": pool, "reward": pool}}],
    }
    async with orchestrator(temporal_env) as queue:
        handle = await client.start_workflow(
            names.TRAINING_WORKFLOW, {"run": run}, id=f"sig-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        try:
            with caplog.at_level(logging.WARNING):
                for bad in (
                    {"workflow_id": 5, "status": "bogus"},
                    raw_json(b'{"workflow_id": "x",'),
                    {
                        "workflow_id": "x",
                        "trajectory_uri": "file:///x",
                        "group": "",
                        "policy_version": 0,
                        "reward": float("nan"),
                        "status": "completed",
                    },
                ):
                    await handle.signal(names.SIGNAL_TRAJECTORY_FINISHED, bad)
                good = TrajectoryReport(
                    workflow_id="user-traj",
                    trajectory_uri=None,
                    group="",
                    policy_version=None,
                    reward=None,
                    status=TrajectoryStatus.FAILED,
                    error="a user's trajectory",
                )
                await handle.signal(names.SIGNAL_TRAJECTORY_FINISHED, good)

                async def counted() -> TrainingProgress | None:
                    p = await handle.query(names.QUERY_PROGRESS, result_type=TrainingProgress)
                    return p if p.counters.external else None

                progress = await async_wait_for(counted, BOUND_S, 0.2, "the valid report to be counted")
            assert (progress.counters.external, progress.counters.failed, progress.counters.completed) == (1, 1, 0)
            assert (await handle.describe()).status.name == "RUNNING"
            assert await task_failures(handle) == []
            dropped = [r.getMessage() for r in caplog.records if "dropping the signal" in r.getMessage()]
            assert len(dropped) == 3 and all("trajectory_finished" in m for m in dropped), dropped
        finally:
            await handle.terminate("test over")
            try:  # the run's one trajectory, waiting on the unserved pool
                await client.get_workflow_handle(f"{handle.id}-g000000-0").terminate("test over")
            except RPCError:
                pass  # never started, or already gone


class FakePools:
    """Fake env, decode and reward activities under the real names, answering as big as a test needs."""

    def __init__(self, host_queue: str, action_chars: int = 10, observation_chars: int = 10) -> None:
        self.host_queue = host_queue
        self.action_chars = action_chars
        self.observation_chars = observation_chars

    @activity.defn(name=names.ENV_RESET)
    async def reset(self, inp: EnvResetInput) -> EnvResetResult:
        handle = SandboxHandle(
            sandbox_id="fake", container_id="fake", host_queue=self.host_queue, worker_id="fake", image="fake"
        )
        return EnvResetResult(handle=handle, observation="Guess.")

    @activity.defn(name=names.ENV_STEP)
    async def step(self, inp: EnvStepInput) -> EnvStepResult:
        return EnvStepResult(observation="o" * self.observation_chars, reward=0.0, terminated=False, truncated=False)

    @activity.defn(name=names.ENV_CLOSE)
    async def close(self, inp: EnvCloseInput) -> None:
        return None

    @activity.defn(name=names.LLM_GENERATE)
    async def generate(self, inp: GenerateInput) -> GenerateResult:
        return GenerateResult(
            text="a" * self.action_chars,
            context_uri="mem://ctx",
            prompt_tokens=1,
            completion_tokens=1,
            policy_version=0,
            finish_reason="stop",
            pool="fake",
            worker_id="fake",
        )

    @activity.defn(name=names.REWARD_SCORE)
    async def score(self, inp: ScoreInput) -> ScoreResult:
        return ScoreResult(reward=0.0, reward_fn=inp.request.reward_fn)

    @activity.defn(name=names.TRAJECTORY_SAVE)
    async def save(self, inp: SaveTrajectoryInput) -> SaveTrajectoryResult:
        return SaveTrajectoryResult(trajectory_uri="mem://trajectory")


@asynccontextmanager
async def fake_stack(temporal_env, fakes: FakePools, pool: str) -> AsyncIterator[str]:
    client = temporal_env.client
    workers = [
        Worker(client, task_queue=names.env_queue(pool), activities=[fakes.reset]),
        Worker(client, task_queue=fakes.host_queue, activities=[fakes.step, fakes.close]),
        Worker(client, task_queue=names.decode_queue(pool), activities=[fakes.generate]),
        Worker(client, task_queue=names.reward_queue(pool), activities=[fakes.score, fakes.save]),
    ]
    async with orchestrator(temporal_env) as queue, workers[0], workers[1], workers[2], workers[3]:
        yield queue


def fake_request(pool: str, max_turns: int) -> TrajectoryRequest:
    return TrajectoryRequest(
        env_id="game:Fake-v0", max_turns=max_turns, pools=StagePools(decode=pool, env=pool, reward=pool)
    )


async def test_an_activity_result_over_the_payload_limit_ends_the_trajectory_failed_after_one_attempt(
    temporal_env,
) -> None:
    """An env that answers 3 MB (one the env worker's cap does not cover): the SDK fails the activity with
    PayloadsTooLarge, which is the env's fault, so the trajectory ends `failed`, unscored, not infra and not retried."""
    pool = f"fat{uuid.uuid4().hex[:6]}"
    fakes = FakePools(f"fat-host-{pool}", observation_chars=3_000_000)
    async with fake_stack(temporal_env, fakes, pool) as queue:
        handle = await temporal_env.client.start_workflow(
            names.TRAJECTORY_WORKFLOW,
            fake_request(pool, 2),
            id=f"fat-{pool}",
            task_queue=queue,
            result_type=TrajectoryResult,
        )
        assert await closed(handle) == "COMPLETED"
        result = await handle.result()
        assert await activity_attempts(handle, names.ENV_STEP) == 1
    print(f"\n{result.status.value}: {result.error}")
    assert result.status is TrajectoryStatus.FAILED and result.reward is None and result.env_recoveries == 0
    assert "env.step: PayloadsTooLarge" in (result.error or "") and "size that exceeded the error limit" in (
        result.error or ""
    )


async def test_an_activity_input_over_the_payload_limit_fails_the_workflow_instead_of_retrying_its_task(
    temporal_env,
) -> None:
    """Two 1.2 MB actions make a 2.4 MB reward.score input: without the stubs' guard the SDK fails the workflow
    task on it forever; with it the workflow fails once, saying which activity and how big."""
    pool = f"big{uuid.uuid4().hex[:6]}"
    fakes = FakePools(f"big-host-{pool}", action_chars=1_200_000)
    async with fake_stack(temporal_env, fakes, pool) as queue:
        handle = await temporal_env.client.start_workflow(
            names.TRAJECTORY_WORKFLOW, fake_request(pool, 2), id=f"big-{pool}", task_queue=queue
        )
        assert await closed(handle) == "FAILED"
        err = await failure(handle)
        assert await task_failures(handle) == []
        assert await activity_attempts(handle, names.REWARD_SCORE) == 0
    print(f"\n{err.type}: {err.message}")
    assert err.type == names.ERR_PAYLOADS_TOO_LARGE and err.non_retryable
    assert err.message.startswith("reward.score: its input would be 2,4") and "lower max_turns" in err.message


async def test_a_training_run_whose_id_holds_an_at_sign_fails_at_once(temporal_env) -> None:
    """A run id is the policy name of its trajectories, and policy RUN@V pins a version: '@' in it is refused."""
    async with orchestrator(temporal_env) as queue:
        handle = await temporal_env.client.start_workflow(
            names.TRAINING_WORKFLOW, {}, id=f"run@{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        assert await closed(handle) == "FAILED"
        err = await failure(handle)
        assert err.type == names.ERR_INVALID_INPUT and err.non_retryable
        assert "may not contain '@'" in err.message
        assert await task_failures(handle) == []
