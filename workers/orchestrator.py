"""Orchestrator worker: runs the workflows (deterministic orchestration, no heavy imports), and the one activity
that needs nothing but the Temporal client: the child watcher of training runs (activities/children.py)."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.worker import Worker

from activities.children import ChildWatchActivities
from infra.settings import Settings
from trajflow.contracts import names
from workers.common import connect_worker, run_until_signalled
from workflows.replay_env import ReplayEnvWorkflow
from workflows.training import TrainingWorkflow
from workflows.trajectory import TrajectoryWorkflow

WORKFLOWS = [TrajectoryWorkflow, TrainingWorkflow, ReplayEnvWorkflow]


def orchestrator_workers(client: Client, task_queue: str = names.WORKFLOW_QUEUE) -> list[Worker]:
    watcher = ChildWatchActivities(client)
    return [Worker(client, task_queue=task_queue, workflows=WORKFLOWS, activities=[watcher.watch_children])]


async def serve(settings: Settings) -> None:
    client = await connect_worker(settings, "orchestrator")
    await run_until_signalled(orchestrator_workers(client))
