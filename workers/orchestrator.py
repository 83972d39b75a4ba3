"""Orchestrator worker: runs the workflows (deterministic orchestration, no heavy imports), and the one activity
that needs nothing but the Temporal client: the child watcher of training runs (activities/children.py). Beside
them, the sweep that cancels the trajectories of training runs that ended early (workers/run_sweep.py)."""

from __future__ import annotations

import asyncio

from temporalio.client import Client
from temporalio.worker import Worker

from trajflow.activities.children import ChildWatchActivities
from trajflow.contracts import names
from trajflow.infra.settings import Settings
from trajflow.workers.common import connect_worker, run_until_signalled
from trajflow.workers.run_sweep import sweep_forever
from trajflow.workflows.replay_env import ReplayEnvWorkflow
from trajflow.workflows.shard import ShardWorkflow
from trajflow.workflows.training import TrainingWorkflow
from trajflow.workflows.trajectory import TrajectoryWorkflow

WORKFLOWS = [TrajectoryWorkflow, TrainingWorkflow, ShardWorkflow, ReplayEnvWorkflow]


def orchestrator_workers(client: Client, task_queue: str = names.WORKFLOW_QUEUE) -> list[Worker]:
    watcher = ChildWatchActivities(client)
    return [Worker(client, task_queue=task_queue, workflows=WORKFLOWS, activities=[watcher.watch_children])]


async def serve(settings: Settings) -> None:
    client = await connect_worker(settings, "orchestrator")
    sweep = asyncio.create_task(sweep_forever(client, settings.run_sweep_s)) if settings.run_sweep_s > 0 else None

    async def stop_sweep() -> None:
        if sweep is not None:
            sweep.cancel()

    await run_until_signalled(orchestrator_workers(client), on_stop=stop_sweep)
