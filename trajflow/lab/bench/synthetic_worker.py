"""Synthetic env worker: the env pool's queues served by `trajflow.lab.bench.synthetic_activities` (benchmarks, no
Docker).

Like `trajflow.workers.env`, it polls each pool's shared queue for resets and its own host queue for steps and closes.
Everything is an asyncio sleep, so concurrency limits are high: one worker hosts every episode of a bench.
"""

from __future__ import annotations

from collections.abc import Sequence

from temporalio.client import Client
from temporalio.worker import Worker

from trajflow.contracts import names
from trajflow.lab.bench.synthetic_activities import SyntheticEnvActivities


def synthetic_env_workers(
    client: Client,
    pools: Sequence[str],
    worker_id: str,
    *,
    unit_s: float,
    step_timeout_s: float = 600.0,
    max_concurrent: int = 1024,
) -> list[Worker]:
    """`unit_s`: seconds per unit of the episodes' step delays (the bench's time unit)."""
    workers: list[Worker] = []
    for pool in pools:
        acts = SyntheticEnvActivities(pool, worker_id, unit_s, step_timeout_s)
        workers.append(
            Worker(
                client,
                task_queue=names.env_queue(pool),
                activities=[acts.reset],
                max_concurrent_activities=max_concurrent,
            )
        )
        workers.append(
            Worker(
                client,
                task_queue=acts.host_queue,
                activities=[acts.step, acts.close],
                max_concurrent_activities=max_concurrent,
            )
        )
    return workers
