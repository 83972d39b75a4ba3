"""Decode worker: one generation engine (a loaded policy) serving the LLM steps of one or more decode pools."""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence

from temporalio.client import Client
from temporalio.worker import Worker

from trajflow.activities.decode import DecodeActivities
from trajflow.contracts import names
from trajflow.contracts.config import ModelConfig
from trajflow.infra.settings import Settings
from trajflow.infra.store import ObjectStore, open_store_from
from trajflow.rl.engines.base import Engine
from trajflow.workers.common import connect_worker, new_worker_id, run_until_signalled

log = logging.getLogger("trajflow.decode")


def decode_workers(
    client: Client, engine: Engine, store: ObjectStore, pools: Sequence[str], worker_id: str, max_concurrent: int = 256
) -> list[Worker]:
    return [
        Worker(
            client,
            task_queue=names.decode_queue(pool),
            activities=[(decoder := DecodeActivities(engine, store, pool, worker_id)).generate, decoder.describe],
            # Many trajectories' turns wait in the engine at once: that is what lets it batch them.
            max_concurrent_activities=max_concurrent,
        )
        for pool in pools
    ]


async def serve(settings: Settings, pools: Sequence[str], model: ModelConfig) -> None:
    from trajflow.infra.policies import PolicyStore, sweep_dead_worker_caches
    from trajflow.rl import devices
    from trajflow.rl.engines.load import decode_device, decode_precision, load_engine

    threads = devices.set_threads(settings.threads)
    if model.openai is None:  # the openai engine computes nothing here: its server has the GPUs
        devices.require_gpus(settings.expect_gpus, settings.hardware_host)  # never the CPU where GPUs were given
    store = open_store_from(settings)
    worker_id = new_worker_id()
    sweep_dead_worker_caches(settings.cache_dir / "policies", socket.gethostname())
    device = decode_device(model, settings.device)
    precision = decode_precision(model, device)
    if model.openai is None:
        log.info("decode on %s, %d torch threads, %s", devices.describe(device), threads, precision.describe())
    key = settings.openai_api_key
    engine = load_engine(
        model,
        cache_dir=settings.cache_dir / "models",
        weights=PolicyStore(store, settings.cache_dir / "policies" / worker_id),
        device=device,
        torch_threads=settings.threads,
        precision=precision,
        api_key=key.get_secret_value() if key is not None else None,
    )
    await engine.start()
    if model.openai is None:
        log.info("engine %s ready (%s)", engine.name, precision.dtype)
    else:
        log.info("engine %s ready: %s, frozen at v%d", engine.name, model.openai.base_url, engine.version)
    client = await connect_worker(settings, "decode")
    await run_until_signalled(decode_workers(client, engine, store, pools, worker_id), on_stop=engine.close)
