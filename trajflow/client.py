"""The Python client: start trajectories from programs, wait for them, load what they recorded; start a training
run, attach to one by its id, follow its progress. Re-exported by `trajflow` (import from there).

    import asyncio
    from trajflow import TrajectoryRequest, run_trajectory

    result = asyncio.run(run_trajectory(TrajectoryRequest(env_id="game:GuessTheNumber-v0-easy", seed=3)))
    print(result.status, result.reward, result.trajectory_uri)

Training runs the same way: `start_training(TrainingRunConfig(steps=20), run_id="my-run")` returns the
TrainingWorkflow's handle (its workflow id is the run id); `attach_training("my-run")` returns the same handle from
another process; `training_progress(handle)` shows where it is.

`stop_training("my-run")` ends it early: graceful (the current step trained, the rest cancelled) or `now=True`.

Addresses come from the `TRAJFLOW_*` settings (the embedded stack's by default).
"""

from __future__ import annotations

import uuid

from temporalio.client import Client, WorkflowHandle

from infra.settings import Settings, load_settings
from infra.store import open_store_from
from infra.temporal import connect
from trajflow.contracts import names
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.training import (
    StopRequest,
    TrainingProgress,
    TrainingResult,
    TrainingRunConfig,
    TrainingStart,
)
from trajflow.contracts.trajectory import TrajectoryRequest, TrajectoryResult


def new_workflow_id(req: TrajectoryRequest) -> str:
    env = req.env_id.replace(":", "-").replace("/", "-")
    return f"traj-{env}-s{req.seed}-{uuid.uuid4().hex[:8]}"


async def start_trajectory(
    request: TrajectoryRequest | None = None,
    *,
    client: Client | None = None,
    settings: Settings | None = None,
    workflow_id: str | None = None,
    task_queue: str = names.WORKFLOW_QUEUE,
) -> WorkflowHandle[object, TrajectoryResult]:
    """Start one TrajectoryWorkflow and return its handle without waiting."""
    request = request or TrajectoryRequest()
    client = client or await connect(settings or load_settings())
    return await client.start_workflow(
        names.TRAJECTORY_WORKFLOW,
        request,
        id=workflow_id or new_workflow_id(request),
        task_queue=task_queue,
        result_type=TrajectoryResult,
    )


async def run_trajectory(
    request: TrajectoryRequest | None = None,
    *,
    client: Client | None = None,
    settings: Settings | None = None,
    workflow_id: str | None = None,
    task_queue: str = names.WORKFLOW_QUEUE,
) -> TrajectoryResult:
    """Run one trajectory to its end and return its result (status, reward, turns, trajectory URI)."""
    handle = await start_trajectory(
        request, client=client, settings=settings, workflow_id=workflow_id, task_queue=task_queue
    )
    return await handle.result()


def load_trajectory(uri: str, settings: Settings | None = None) -> TrajectoryRecord:
    """Read a finished trajectory (transcript, token ids, logprobs, masks, versions) from the store."""
    settings = settings or load_settings()
    store = open_store_from(settings)
    return TrajectoryRecord.model_validate(store.get_json(uri))


def new_run_id() -> str:
    return f"run-{uuid.uuid4().hex[:10]}"


async def start_training(
    run: TrainingRunConfig | None = None,
    *,
    run_id: str | None = None,
    client: Client | None = None,
    settings: Settings | None = None,
    task_queue: str = names.WORKFLOW_QUEUE,
) -> WorkflowHandle[object, TrainingResult]:
    """Start a TrainingWorkflow (workflow id = run id) and return a handle to the run's newest execution, so
    queries and the result follow it through continue-as-new."""
    if run_id and "@" in run_id:
        raise ValueError(f"run id {run_id!r}: a run id may not contain '@' (RUN@V names version V of run RUN)")
    client = client or await connect(settings or load_settings())
    started = await client.start_workflow(
        names.TRAINING_WORKFLOW,
        TrainingStart(run=run or TrainingRunConfig()),
        id=run_id or new_run_id(),
        task_queue=task_queue,
        result_type=TrainingResult,
    )
    return client.get_workflow_handle(started.id, result_type=TrainingResult)


async def attach_training(
    run_id: str, *, client: Client | None = None, settings: Settings | None = None
) -> WorkflowHandle[object, TrainingResult]:
    """The handle of an existing training run (its newest execution), to query its progress or await its result
    from a process other than the one that started it. Raises LookupError when no run has that id."""
    from temporalio.service import RPCError, RPCStatusCode

    client = client or await connect(settings or load_settings())
    handle = client.get_workflow_handle(run_id, result_type=TrainingResult)
    try:
        await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise LookupError(f"no training run {run_id!r} on {client.namespace}") from None
        raise
    return handle


async def training_progress(handle: WorkflowHandle) -> TrainingProgress:
    """The run's live state (version, buffer, counters, last step) from the workflow's `progress` query."""
    return await handle.query(names.QUERY_PROGRESS, result_type=TrainingProgress)


async def stop_training(
    run_id: str,
    *,
    now: bool = False,
    reason: str = "stopped by request",
    client: Client | None = None,
    settings: Settings | None = None,
) -> WorkflowHandle[object, TrainingResult]:
    """Ask a training run to end early and return its handle (await `handle.result()` for the end): graceful, it
    admits nothing more, trains the current step and cancels the rest; `now`, it cancels every running
    trajectory at once. The result's `stopped` says why and at which version. LookupError for an unknown run."""
    handle = await attach_training(run_id, client=client, settings=settings)
    await handle.signal(names.SIGNAL_STOP, StopRequest(now=now, reason=reason))
    return handle
