"""`trajflow replay WORKFLOW_ID --env-only`: re-drive a fresh sandbox with a trajectory's recorded actions, no LLM,
printing each observation (beside the recorded one), reward and done flag, so an env bug can be reproduced.

It starts a `ReplayEnvWorkflow` on the original's task queue, which calls `env.reset`, `env.step` and `env.close`
on the original's env pool: the running stack's env worker resolves the image, takes a (warm) sandbox and applies
its limits and observation formatting exactly as it did for the original. Calling the sandbox manager from the
CLI instead would need Docker on the CLI's machine and could pick a different image or limits than the pool that
ran the episode; going through the pool reproduces what the trajectory saw.

The actions come from the trajectory's record in the object store (every trajectory that ended has one, an
infra-failed one included: its turns up to the failure). Limits: no LLM, so only the recorded actions are sent;
the replay stops at the first failed step (which is what an env bug looks like) or when the episode ends.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable

from temporalio.client import Client, WorkflowHandle, WorkflowQueryFailedError
from temporalio.service import RPCError

from trajflow.cli.replay.formatting import shorten
from trajflow.cli.replay.rerun import ReplayError, outcome, started_request
from trajflow.contracts import names
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.replay import EnvReplayInput, EnvReplayResult, EnvReplayStep
from trajflow.infra.store import ObjectStore

POLL_S = 0.5


def replay_input(record: TrajectoryRecord, workflow_id: str) -> EnvReplayInput:
    req = record.request
    return EnvReplayInput(
        env_id=req.env_id,
        seed=req.seed,
        env_kwargs=req.env_kwargs,
        env_package=req.env_package,
        actions=[t.sent or t.action for t in record.turns],
        env_pool=req.pools.env,
        replay_of=workflow_id,
    )


def format_step(i: int, step: EnvReplayStep, recorded: str | None, width: int = 100) -> str:
    """One replayed step: the action, the observation now and whether it matches the recorded one."""
    same = "same as recorded" if recorded == step.observation else f"DIFFERS from recorded: {shorten(recorded, width)}"
    return (
        f"--- step {i + 1}\n[action] {shorten(step.action, width)}\n[observation] {step.observation.strip()}\n"
        f"reward {step.reward:g}  terminated {step.terminated}  truncated {step.truncated}  ({same})"
    )


async def replay_env(
    client: Client, store: ObjectStore, workflow_id: str, timeout_s: float, as_json: bool, out: Callable[[str], None]
) -> int:
    """Run the env-only replay of `workflow_id`, printing steps as they come; 0 if every step ran, else 1."""
    old = await outcome(client, store, workflow_id)
    if old.record is None:
        raise ReplayError(f"{workflow_id} has no stored record (it ended with: {old.failure}): no actions to replay")
    _, queue = await started_request(client, workflow_id)
    inp = replay_input(old.record, workflow_id)
    handle = await client.start_workflow(
        names.REPLAY_ENV_WORKFLOW,
        inp,
        id=f"{workflow_id}-env-{uuid.uuid4().hex[:6]}",
        task_queue=queue,
        result_type=EnvReplayResult,
    )
    recorded = [t.observation for t in old.record.turns]
    if not as_json:
        out(f"env-only replay {handle.id}: {inp.env_id} seed {inp.seed}, {len(inp.actions)} recorded actions")
    result = await _follow(handle, timeout_s, None if as_json else out, old.record.first_observation, recorded)
    if as_json:
        out(
            json.dumps(
                {
                    "workflow_id": handle.id,
                    "replay_of": workflow_id,
                    **result.model_dump(mode="json"),
                    "recorded_first_observation": old.record.first_observation,
                    "recorded_observations": recorded,
                },
                indent=2,
            )
        )
    else:
        out(f"\nsandbox {result.sandbox_id} on worker {result.worker_id}, image {result.image}")
        ended = (
            "the episode ended"
            if result.steps and (result.steps[-1].terminated or result.steps[-1].truncated)
            else "no end"
        )
        out(f"replayed {len(result.steps)}/{len(inp.actions)} actions; {ended}; error: {result.error or 'none'}")
    return 1 if result.error else 0


async def _follow(
    handle: WorkflowHandle,
    timeout_s: float,
    out: Callable[[str], None] | None,
    first_recorded: str,
    recorded: list[str],
) -> EnvReplayResult:
    """Poll the workflow's `progress` query (bounded), printing each new step; return the final result."""
    deadline = time.monotonic() + timeout_s
    shown, first_shown = 0, False
    result_task = asyncio.ensure_future(handle.result())
    try:
        while True:
            done = result_task.done()
            progress = result_task.result() if done else await _query(handle)
            if out is not None and progress is not None:
                if progress.first_observation and not first_shown:
                    same = (
                        "same as recorded" if progress.first_observation == first_recorded else "DIFFERS from recorded"
                    )
                    out(f"[observation] {progress.first_observation.strip()}\n({same})")
                    first_shown = True
                for i in range(shown, len(progress.steps)):
                    out(format_step(i, progress.steps[i], recorded[i] if i < len(recorded) else None))
                shown = len(progress.steps)
            if done and progress is not None:
                return progress
            if time.monotonic() > deadline:
                raise ReplayError(f"{handle.id} did not end within {timeout_s:.0f}s")
            await asyncio.wait({result_task}, timeout=POLL_S)
    finally:
        result_task.cancel()


async def _query(handle: WorkflowHandle) -> EnvReplayResult | None:
    """The replay's progress, or None before its first workflow task ran (a query cannot be answered then)."""
    try:
        return await handle.query(names.QUERY_PROGRESS, result_type=EnvReplayResult)
    except (RPCError, WorkflowQueryFailedError):
        return None
