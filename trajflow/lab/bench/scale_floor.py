"""The floor under `bench scale`'s overhead: one workflow running no-op activities one after another, alone on the
stack's server, with its worker in the driver process. Each activity's round trip (the workflow schedules it, a
worker runs it, the result comes back in the next workflow task) is the least any activity of a trajectory pays here,
whatever the load; the server's CPU per round trip says what each costs it.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from trajflow.lab.bench.scale_stack import cpu_s


@activity.defn(name="bench.noop")
async def noop() -> None:
    return None


@workflow.defn(name="BenchSequentialNoops")
class SequentialNoops:
    @workflow.run
    async def run(self, n: int) -> float:
        """Mean seconds per activity round trip, in workflow time."""
        t0 = workflow.time()
        for _ in range(n):
            await workflow.execute_activity(noop, start_to_close_timeout=timedelta(seconds=30))
        return (workflow.time() - t0) / n


async def floor(client: Client, server_pid: int | None, n: int = 100) -> dict[str, float]:
    """{"round_trip_ms", "server_cpu_ms"} per activity of `n` in sequence."""
    queue = f"bench-floor-{uuid.uuid4().hex[:6]}"
    worker = Worker(
        client,
        task_queue=queue,
        workflows=[SequentialNoops],
        activities=[noop],
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    async with worker:
        cpu0, t0 = cpu_s(server_pid) if server_pid else 0.0, time.monotonic()
        per = await client.execute_workflow(SequentialNoops.run, n, id=queue, task_queue=queue)
        wall = time.monotonic() - t0
        cpu = (cpu_s(server_pid) - cpu0) if server_pid else float("nan")
    return {
        "activities": n,
        "round_trip_ms": round(per * 1e3, 2),
        "wall_s": round(wall, 2),
        "server_cpu_ms": round(cpu / n * 1e3, 2),
    }
