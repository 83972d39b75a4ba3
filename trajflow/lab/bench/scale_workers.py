"""The worker processes of `trajflow bench scale`, one per role as `trajflow up` runs them: the orchestrator
(the real workflows), decode (the real activity on a `SimulatedEngine`), env (the synthetic env) and reward (the real
activities, scoring over HTTP and saving to the store). Each traces a share of the trajectories to a JSON-lines file
(`trajflow.observability.tracing`), which the bench reads back for the overhead per activity.

Run as `python -m trajflow.lab.bench.scale_workers ROLE --address ... --queue ... --pool ...` by
`trajflow.lab.bench.scale`, which ends it with SIGTERM (it then shuts its workers down and flushes its spans).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

ROLES = ("orchestrator", "decode", "env", "reward")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trajflow.lab.bench.scale_workers", description="A worker process of `trajflow bench scale`."
    )
    p.add_argument("role", choices=ROLES)
    p.add_argument("--address", required=True, help="The Temporal server, host:port.")
    p.add_argument("--queue", required=True, help="The orchestrator's task queue.")
    p.add_argument("--pool", required=True, help="The one pool of every stage.")
    p.add_argument("--store", type=Path, required=True, help="The LocalStore's directory.")
    p.add_argument("--traces", type=Path, required=True, help="Where this process writes its spans.")
    p.add_argument("--trace-share", type=float, default=0.05)
    p.add_argument("--decode-s", type=float, default=5.0, help="Median seconds of one simulated LLM turn.")
    p.add_argument("--slots", type=int, default=20_000, help="The simulated engine's batch slots.")
    p.add_argument("--activity-slots", type=int, default=10_000, help="Activities each worker runs at once.")
    p.add_argument("--reward-url", default="", help="The reward service (reward role).")
    p.add_argument("--cache-dir", type=Path, default=Path.home() / ".trajflow" / "cache" / "models")
    p.add_argument(
        "--workflow-cache", type=int, default=None, help="The orchestrator's sticky cache (None: the SDK's)."
    )
    return p


async def serve(a: argparse.Namespace) -> None:
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Worker

    from trajflow.infra.store import LocalStore
    from trajflow.lab.bench.stack import quiet_runtime
    from trajflow.observability import tracing
    from trajflow.workers.common import run_until_signalled

    exporter = tracing.JsonLinesExporter(a.traces / f"{a.role}-{os.getpid()}.jsonl")
    tracing.install(exporter, a.role, str(exporter.path), sample=a.trace_share)
    client = await Client.connect(
        a.address, data_converter=pydantic_data_converter, plugins=tracing.plugins(), runtime=quiet_runtime()
    )
    store = LocalStore(a.store / "store")
    on_stop = None
    workers: list[Worker]
    if a.role == "orchestrator":
        from trajflow.workflows.trajectory import TrajectoryWorkflow

        extra = {"max_cached_workflows": a.workflow_cache} if a.workflow_cache is not None else {}
        workers = [Worker(client, task_queue=a.queue, workflows=[TrajectoryWorkflow], **extra)]
    elif a.role == "decode":
        from trajflow.infra.policies import PolicyStore
        from trajflow.lab.bench.sim_engine import SimulatedEngine
        from trajflow.lab.bench.stack import tokenizer
        from trajflow.workers.decode import decode_workers

        engine = SimulatedEngine(
            tokenizer(a.cache_dir),
            slots=a.slots,
            unit_s=a.decode_s,
            median_units=1.0,
            sigma=0.3,
            seed=0,
            weights=PolicyStore(store, a.store / f"policies-{os.getpid()}", pointer_ttl_s=0.0),
        )
        await engine.start()
        on_stop = engine.close
        workers = decode_workers(
            client, engine, store, [a.pool], f"decode-{os.getpid()}", max_concurrent=a.activity_slots
        )
    elif a.role == "env":
        from trajflow.lab.bench.synthetic_worker import synthetic_env_workers

        workers = synthetic_env_workers(
            client, [a.pool], f"env-{os.getpid()}", unit_s=1.0, max_concurrent=a.activity_slots
        )
    else:
        from trajflow.rewards.client import RewardClient
        from trajflow.workers.reward import reward_workers

        reward_client = RewardClient(a.reward_url, timeout_s=30)
        on_stop = reward_client.close
        workers = reward_workers(client, reward_client, store, [a.pool])
    await run_until_signalled(workers, on_stop=on_stop)


def main() -> None:
    asyncio.run(serve(parser().parse_args()))


if __name__ == "__main__":
    main()
