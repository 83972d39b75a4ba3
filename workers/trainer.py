"""Trainer worker: one process per trainer pool host, keeping one run's model and optimizer in memory and
taking that run's optimizer steps one at a time."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from activities.trainer import TrainerActivities
from contracts import names
from contracts.config import ModelConfig
from infra.policies import PolicyStore
from infra.settings import Settings
from infra.store import ObjectStore, open_store_from
from infra.temporal import wait_until_reachable
from workers.common import new_worker_id, run_until_signalled

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
) -> list[Worker]:
    acts = TrainerActivities(store, PolicyStore(store, cache_dir), model_path, work_dir, export_dtype, device)
    return [
        Worker(
            client,
            task_queue=names.trainer_queue(pool),
            activities=[acts.train_step],
            max_concurrent_activities=1,  # one optimizer step at a time: the model is one object
        )
        for pool in pools
    ]


async def serve(settings: Settings, pools: Sequence[str], model: ModelConfig) -> None:
    from rl import devices
    from rl.engines.load import decode_precision
    from rl.models import resolve_model
    from rl.precision import choose_precision

    threads = devices.set_threads(settings.threads)
    device = devices.resolve_device(settings.device)
    model_path = resolve_model(model.name_or_path, settings.cache_dir / "models")
    # The step's autocast is per run (TrainerConfig.autocast); "auto" means this device's native choice.
    log.info(
        "trainer on %s, %d torch threads, %s (autocast auto)",
        devices.describe(device),
        threads,
        choose_precision(device).describe(),
    )
    # decode workers on the same kind of host as this one run this dtype; others cast on load
    export = decode_precision(model, device)
    log.info("published weights in %s, the decode workers' dtype (%s)", export.dtype, export.reason)
    store = open_store_from(settings)
    client = await wait_until_reachable(settings)
    worker_id = new_worker_id()
    log.info("trainer %s for %s, pools %s", worker_id, model_path, list(pools))
    work_dir = settings.state_dir / "trainer" / worker_id
    await run_until_signalled(
        trainer_workers(
            client,
            store,
            model_path,
            work_dir,
            pools,
            settings.cache_dir / "policies" / worker_id,
            export.dtype,
            device,
        )
    )
