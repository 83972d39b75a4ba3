"""Typed stubs for calling activities by name from workflows, each with its timeouts, routing and retries.

Workflows never import activity code: they call names from `trajflow.contracts.names` with contracts models, and these
stubs fix the options in one place. Error classification of activity failures lives here too.

Payload sizes: an activity input over `MAX_PAYLOAD_BYTES` is refused here with a non-retryable `PayloadsTooLarge`
error (raised in the workflow, which then fails) instead of being scheduled, because the SDK would fail the
workflow task on it again and again, forever; an activity *result* over Temporal's limit is failed by the SDK
with the same type, which every retry policy here treats as final.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from trajflow.contracts import names
    from trajflow.contracts.branches import BranchInput, BranchPrefix
    from trajflow.contracts.engines import EngineInfo
    from trajflow.contracts.limits import MAX_PAYLOAD_BYTES
    from trajflow.contracts.scoring import ScoreInput, ScoreResult
    from trajflow.contracts.shards import GroupManifest
    from trajflow.contracts.training import TrainStepInput, TrainStepResult, WatchChildrenInput, WatchChildrenResult
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
    )

FATAL = [names.ERR_BAD_REQUEST, names.ERR_PAYLOADS_TOO_LARGE]
"""Failures no retry of any activity can fix: a bad request, a payload over Temporal's limit."""
ENV_FATAL = [names.ERR_ENV, *FATAL]
REWARD_FATAL = [names.ERR_REWARD_REJECTED, names.ERR_REWARD_BAD_ANSWER, names.ERR_VERIFIER_TIMEOUT, *FATAL]
"""Reward errors that end a trajectory `failed` (not retried, never scored); any other ends it `infra_failed`."""
InputT = TypeVar("InputT")
QUICK_HEARTBEAT = timedelta(seconds=15)
"""The heartbeat timeout of the activities that heartbeat every `trajflow.activities.heartbeats.QUICK_EVERY_S`."""


def _fits(activity: str, inp: InputT) -> InputT:
    """`inp`, or a non-retryable PayloadsTooLarge error when it is too large to schedule `activity` with."""
    size = len(inp.model_dump_json().encode())  # type: ignore[attr-defined]  # the bytes the pydantic converter writes
    if size > MAX_PAYLOAD_BYTES:
        raise ApplicationError(
            f"{activity}: its input would be {size:,} bytes, over the {MAX_PAYLOAD_BYTES:,} bytes one Temporal payload "
            "may hold (long episodes of long actions or observations: lower max_turns, max_new_tokens or the "
            "env's output)",
            type=names.ERR_PAYLOADS_TOO_LARGE,
            non_retryable=True,
        )
    return inp


def error_type(err: BaseException) -> str | None:
    """The ApplicationError type behind an activity failure, or the timeout kind, or None."""
    cause = err.cause if isinstance(err, ActivityError) else err
    if isinstance(cause, ApplicationError):
        return cause.type
    if isinstance(cause, TimeoutError):
        return f"Timeout:{cause.type.name if cause.type else 'UNKNOWN'}"
    return None


def is_env_fault(err: BaseException) -> bool:
    """True when the environment itself rejected the episode (not an infrastructure failure)."""
    return error_type(err) in ENV_FATAL


def describe(err: BaseException) -> str:
    """`Type: message` of an activity's failure, the type said once (the SDK's str of an ApplicationError already
    starts with its type, and our activities' messages often do too)."""
    cause = err.cause if isinstance(err, ActivityError) and err.cause else err
    kind = error_type(err) or type(cause).__name__
    message = cause.message if isinstance(cause, FailureError) else str(cause)
    return message if message.startswith(f"{kind}: ") else f"{kind}: {message}"


async def env_reset(pool: str, inp: EnvResetInput, extra: timedelta = timedelta(0)) -> EnvResetResult:
    """`extra`: time on top of the usual five minutes (an agent program's calls on the way to its state)."""
    return await workflow.execute_activity(
        names.ENV_RESET,
        _fits(names.ENV_RESET, inp),
        result_type=EnvResetResult,
        task_queue=names.env_queue(pool),
        start_to_close_timeout=timedelta(minutes=5) + extra,
        heartbeat_timeout=timedelta(seconds=20),  # env.reset heartbeats every 5 s while it works
        retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=ENV_FATAL),
    )


async def env_step(handle: SandboxHandle, action: str, step_timeout: timedelta) -> EnvStepResult:
    # One attempt: a step that failed may or may not have been applied, so the workflow recovers with a
    # fresh sandbox and replays instead of retrying here. An unpolled host queue (dead env worker) fails
    # by schedule_to_start, which the workflow treats the same way.
    return await workflow.execute_activity(
        names.ENV_STEP,
        _fits(names.ENV_STEP, EnvStepInput(handle=handle, action=action)),
        result_type=EnvStepResult,
        task_queue=handle.host_queue,
        schedule_to_start_timeout=timedelta(seconds=30),
        start_to_close_timeout=step_timeout + timedelta(seconds=15),
        heartbeat_timeout=QUICK_HEARTBEAT,
        retry_policy=RetryPolicy(maximum_attempts=1),
    )


async def env_close(handle: SandboxHandle) -> None:
    await workflow.execute_activity(
        names.ENV_CLOSE,
        EnvCloseInput(handle=handle),
        task_queue=handle.host_queue,
        schedule_to_start_timeout=timedelta(seconds=10),
        start_to_close_timeout=timedelta(seconds=30),
        heartbeat_timeout=QUICK_HEARTBEAT,
        retry_policy=RetryPolicy(maximum_attempts=2),
    )


async def llm_generate(pool: str, inp: GenerateInput) -> GenerateResult:
    return await workflow.execute_activity(
        names.LLM_GENERATE,
        _fits(names.LLM_GENERATE, inp),
        result_type=GenerateResult,
        task_queue=names.decode_queue(pool),
        start_to_close_timeout=timedelta(minutes=10),
        heartbeat_timeout=timedelta(seconds=30),  # llm.generate heartbeats every 5 s while the engine works
        retry_policy=RetryPolicy(
            initial_interval=timedelta(seconds=1),
            maximum_interval=timedelta(seconds=30),
            maximum_attempts=10,
            non_retryable_error_types=FATAL,
        ),
    )


async def llm_describe(pool: str) -> EngineInfo:
    # Waits for a decode worker as the run's turns would (no schedule-to-start limit); an attempt is a quick answer.
    return await workflow.execute_activity(
        names.LLM_DESCRIBE,
        result_type=EngineInfo,
        task_queue=names.decode_queue(pool),
        start_to_close_timeout=timedelta(seconds=30),
        retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30), non_retryable_error_types=FATAL),
    )


async def reward_score(pool: str, inp: ScoreInput) -> ScoreResult:
    return await workflow.execute_activity(
        names.REWARD_SCORE,
        _fits(names.REWARD_SCORE, inp),
        result_type=ScoreResult,
        task_queue=names.reward_queue(pool),
        start_to_close_timeout=timedelta(seconds=60),
        heartbeat_timeout=QUICK_HEARTBEAT,
        retry_policy=RetryPolicy(
            initial_interval=timedelta(seconds=1),
            maximum_interval=timedelta(seconds=10),
            maximum_attempts=6,
            non_retryable_error_types=REWARD_FATAL,
        ),
    )


async def trajectory_save(pool: str, inp: SaveTrajectoryInput) -> SaveTrajectoryResult:
    return await workflow.execute_activity(
        names.TRAJECTORY_SAVE,
        _fits(names.TRAJECTORY_SAVE, inp),
        result_type=SaveTrajectoryResult,
        task_queue=names.reward_queue(pool),
        start_to_close_timeout=timedelta(seconds=60),
        heartbeat_timeout=QUICK_HEARTBEAT,
        retry_policy=RetryPolicy(maximum_attempts=10, non_retryable_error_types=FATAL),
    )


async def trajectory_branch(pool: str, inp: BranchInput) -> BranchPrefix:
    """A branch's parent prefix (its turns before the branch turn) and the parent's context cut there."""
    return await workflow.execute_activity(
        names.TRAJECTORY_BRANCH,
        inp,
        result_type=BranchPrefix,
        task_queue=names.reward_queue(pool),
        start_to_close_timeout=timedelta(seconds=60),
        heartbeat_timeout=QUICK_HEARTBEAT,
        retry_policy=RetryPolicy(maximum_attempts=10, non_retryable_error_types=FATAL),
    )


async def group_save(pool: str, manifest: GroupManifest) -> str:
    """Write a complete group's manifest to the store (a sharded run's shard, before it reports the group); its URI."""
    return await workflow.execute_activity(
        names.GROUP_SAVE,
        _fits(names.GROUP_SAVE, manifest),
        result_type=str,
        task_queue=names.reward_queue(pool),
        start_to_close_timeout=timedelta(seconds=60),
        heartbeat_timeout=QUICK_HEARTBEAT,
        retry_policy=RetryPolicy(maximum_attempts=10, non_retryable_error_types=FATAL),
    )


async def train_step(pool: str, inp: TrainStepInput) -> TrainStepResult:
    # Retried without limit on infra errors (a trainer killed mid-step resumes from its last checkpoint; the
    # activity is idempotent: a step already published is returned, not trained twice).
    return await workflow.execute_activity(
        names.TRAIN_STEP,
        _fits(names.TRAIN_STEP, inp),
        result_type=TrainStepResult,
        task_queue=names.trainer_queue(pool),
        start_to_close_timeout=timedelta(hours=2),
        heartbeat_timeout=timedelta(seconds=30),  # the trainer heartbeats every 5 s: a killed one is noticed fast
        retry_policy=RetryPolicy(
            initial_interval=timedelta(seconds=2),
            maximum_interval=timedelta(seconds=30),
            non_retryable_error_types=FATAL,
        ),
    )


async def watch_children(inp: WatchChildrenInput) -> WatchChildrenResult:
    # On the workflow's own queue (the orchestrator worker serves it); runs as long as the children do, so a
    # start-to-close timeout only bounds one attempt, and attempts go on without limit.
    return await workflow.execute_activity(
        names.WATCH_CHILDREN,
        _fits(names.WATCH_CHILDREN, inp),
        result_type=WatchChildrenResult,
        task_queue=workflow.info().task_queue,
        start_to_close_timeout=timedelta(hours=1),
        heartbeat_timeout=timedelta(seconds=30),  # it heartbeats every poll (2 s)
        retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30), non_retryable_error_types=FATAL),
    )
