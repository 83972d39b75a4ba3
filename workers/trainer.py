"""Trainer worker: one process per trainer pool host, keeping one run's model and optimizer in memory and
taking that run's optimizer steps one at a time.

Under `accelerate launch` (or torchrun) it is one rank of a group (`trajflow.rl.distributed`): rank 0 is the Temporal
worker and leads; every other rank only follows rank 0's step orders and never talks to Temporal. When a step
breaks the group, rank 0 stops its worker and exits non-zero, so the launcher (`--max_restarts`) restarts
every rank."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from trajflow.activities.trainer import TrainerActivities
from trajflow.contracts import names
from trajflow.contracts.config import ModelConfig
from trajflow.infra.policies import PolicyStore, sweep_dead_worker_caches
from trajflow.infra.settings import Settings
from trajflow.infra.store import ObjectStore, open_store_from
from trajflow.workers.common import connect_worker, new_worker_id, run_until_signalled

log = logging.getLogger("trajflow.trainer")


def trainer_workers(
    client: Client,
    store: ObjectStore,
    model_path: Path,
    work_dir: Path,
    pools: Sequence[str],
    cache_dir: Path,
    export_dtype: str = "float32",
    device: str = "auto",
    acts: TrainerActivities | None = None,
) -> list[Worker]:
    """The trainer pools' Temporal workers (`acts`: the activities, when the caller keeps them; else built here,
    one process computing on `device`)."""
    acts = acts or TrainerActivities(
        store, PolicyStore(store, cache_dir), model_path, work_dir, export_dtype, device=device
    )
    return [
        Worker(
            client,
            task_queue=names.trainer_queue(pool),
            activities=[acts.train_step],
            max_concurrent_activities=1,  # one optimizer step at a time: the model is one object
        )
        for pool in pools
    ]


async def serve(settings: Settings, pools: Sequence[str], model: ModelConfig) -> int:
    """Run the trainer until a signal (0), or until its rank group broke (1). A rank > 0 of a launched group
    follows rank 0 instead (0 when rank 0 released it)."""
    import asyncio

    import torch

    from trajflow.rl import devices, distributed
    from trajflow.rl.engines.load import decode_precision
    from trajflow.rl.models import resolve_model
    from trajflow.rl.precision import choose_precision

    threads = devices.set_threads(settings.threads)
    devices.require_gpus(settings.expect_gpus, settings.hardware_host)  # never the CPU where GPUs were given
    device = devices.resolve_device(settings.device)
    distributed.join_launched_group()
    grouped = torch.distributed.is_initialized()
    rank = torch.distributed.get_rank() if grouped else 0
    # rank 0 resolves (converts and caches) the model first; the other ranks then find it in the cache
    if grouped and rank > 0:
        torch.distributed.barrier()
    model_path = resolve_model(model.name_or_path, settings.cache_dir / "models")
    if grouped and rank == 0:
        torch.distributed.barrier()
    if rank > 0:
        log.info("trainer rank %d (pid %d) follows rank 0", rank, os.getpid())
        distributed.TrainerRanks(model_path, device).follow()
        return 0
    ranks = distributed.TrainerRanks(model_path, device)
    # The step's autocast is per run (TrainerConfig.autocast); "auto" means this device's native choice.
    log.info(
        "trainer on %s, %d torch threads, %s (autocast auto), %d rank(s)",
        devices.describe(device),
        threads,
        choose_precision(device).describe(),
        ranks.world,
    )
    # decode workers on the same kind of host as this one run this dtype; others cast on load
    export = decode_precision(model, device)
    log.info("published weights in %s, the decode workers' dtype (%s)", export.dtype, export.reason)
    store = open_store_from(settings)
    client = await connect_worker(settings, "trainer")
    worker_id = new_worker_id()
    log.info("trainer %s for %s, pools %s", worker_id, model_path, list(pools))
    work_dir = settings.state_dir / "trainer" / worker_id
    sweep_dead_worker_caches(settings.cache_dir / "policies", socket.gethostname())
    cache_dir = settings.cache_dir / "policies" / worker_id
    loop = asyncio.get_running_loop()
    broken = asyncio.Event()
    acts = TrainerActivities(
        store, PolicyStore(store, cache_dir), model_path, work_dir, export.dtype, ranks=ranks, on_broken=broken.set
    )
    workers = trainer_workers(client, store, model_path, work_dir, pools, cache_dir, export.dtype, acts=acts)
    pinger = loop.create_task(acts.keep_followers(distributed.KEEPALIVE_EVERY_S)) if ranks.world > 1 else None

    async def release() -> None:
        if pinger is not None:
            pinger.cancel()
            await acts.release_followers()

    await run_until_signalled(workers, on_stop=release, stop_when=broken)
    if broken.is_set():
        log.error("the trainer's rank group broke: exiting so the launcher restarts every rank")
        return 1
    return 0
