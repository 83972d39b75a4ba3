"""The Python client: start trajectories from programs, wait for them, load what they recorded; start a training
run, attach to one by its id, follow its progress. Re-exported by `trajflow` (import from there).

    import asyncio
    from trajflow import TrajectoryRequest, run_trajectory

    result = asyncio.run(run_trajectory(TrajectoryRequest(env_id="game:GuessTheNumber-v0-easy", seed=3)))
    print(result.status, result.reward, result.trajectory_uri)

Training runs the same way: `start_training(TrainingRunConfig(steps=20), run_id="my-run")` returns the
TrainingWorkflow's handle (its workflow id is the run id); `attach_training("my-run")` returns the same handle from
another process; `training_progress(handle)` shows where it is.

`start_branches("traj-...", turn=2, n=4)` starts 4 continuations of a finished trajectory from its turn 2 (each a
trajectory of its own, restored to the parent's state at turn 2: `trajflow.contracts.branches`).

`stop_training("my-run")` ends it early: graceful (the current step trained, the rest cancelled) or `now=True`.

Addresses come from the `TRAJFLOW_*` settings (the embedded stack's by default).
"""

from __future__ import annotations

import uuid

from temporalio.client import Client, WorkflowHandle

from trajflow.contracts import names
from trajflow.contracts.branches import BranchRefused, check_branchable
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.training import (
    StopRequest,
    TrainingProgress,
    TrainingResult,
    TrainingRunConfig,
    TrainingStart,
)
from trajflow.contracts.trajectory import TrajectoryRequest, TrajectoryResult
from trajflow.infra.settings import Settings, load_settings
from trajflow.infra.store import ObjectStore, open_store_from
from trajflow.infra.temporal import connect


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


def branch_id(parent: str, turn: int, index: int) -> str:
    """`<parent>-b<turn>-<index>-<hex4>`: readable, and new on every call (a re-run starts new workflows)."""
    return f"{parent}-b{turn}-{index}-{uuid.uuid4().hex[:4]}"


async def parent_record(client: Client, store: ObjectStore, workflow_id: str) -> tuple[TrajectoryRecord, str, str]:
    """A finished trajectory's record, its URI and its task queue, for branching; LookupError for an unknown workflow,
    BranchRefused for one that cannot be branched (still running, not a trajectory, no record)."""
    from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
    from temporalio.service import RPCError, RPCStatusCode

    handle = client.get_workflow_handle(workflow_id, result_type=TrajectoryResult)
    try:
        desc = await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise LookupError(f"no workflow {workflow_id!r} on {client.namespace}") from None
        raise
    if desc.workflow_type != names.TRAJECTORY_WORKFLOW:
        raise BranchRefused(f"{workflow_id} is a {desc.workflow_type}, not a {names.TRAJECTORY_WORKFLOW}")
    if desc.status == WorkflowExecutionStatus.RUNNING:
        raise BranchRefused(f"{workflow_id} is still running: branch it once it has ended")
    try:
        result = await handle.result(follow_runs=False)
    except WorkflowFailureError as e:
        raise BranchRefused(f"{workflow_id} ended without a result ({e.cause or e})") from None
    if not result.trajectory_uri:
        raise BranchRefused(f"{workflow_id} saved no record")
    record = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri))
    return record, result.trajectory_uri, desc.task_queue


async def start_branches(
    workflow_id: str,
    turn: int,
    n: int = 1,
    *,
    client: Client | None = None,
    settings: Settings | None = None,
    store: ObjectStore | None = None,
    first_index: int = 0,
    policy: str | None = None,
) -> list[WorkflowHandle[object, TrajectoryResult]]:
    """Start `n` branches of the finished trajectory `workflow_id` at `turn` (1-based): each reuses the parent's
    turns 1..turn-1 (their context and, by replay, the env's state) and samples from `turn` on, with its own
    sampling seed (branch indices `first_index`.., `TrajectoryRequest.branch_index`). The branches run on the
    parent's task queue and pools, with `policy` (None: the parent's). Raises LookupError for an unknown workflow and
    `BranchRefused` (a ValueError) when the parent cannot be branched at `turn`; nothing is started then."""
    if n < 1:
        raise BranchRefused(f"n = {n}: start at least one branch")
    settings = settings or load_settings()
    client = client or await connect(settings)
    store = store or open_store_from(settings)
    record, uri, queue = await parent_record(client, store, workflow_id)
    check_branchable(record, turn)
    handles = []
    for index in range(first_index, first_index + n):
        req = TrajectoryRequest(
            branch_of=workflow_id,
            branch_turn=turn,
            branch_record=uri,
            branch_index=index,
            pools=record.request.pools,
            policy=record.request.policy if policy is None else policy,
        )
        handles.append(
            await client.start_workflow(
                names.TRAJECTORY_WORKFLOW,
                req,
                id=branch_id(workflow_id, turn, index),
                task_queue=queue,
                result_type=TrajectoryResult,
            )
        )
    return handles
