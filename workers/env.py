"""Env worker: Docker sandboxes on this host for one or more env pools.

At start it builds (or finds cached) the runtime image and reaps sandboxes left by dead env workers. It polls
each pool's shared queue for resets and its own host queue for the steps of the sandboxes it holds. Beside the
Temporal workers, a sweep (`workers/sandbox_sweep.py`) runs every quarter lease (`TRAJFLOW_SANDBOX_LEASE_S`): it
removes this worker's sandboxes whose trajectory no longer runs or that sat idle too long, and the orphans of dead
env workers on this engine. A warm pool keeps `sandbox_warm_pool` started sandboxes waiting for each env it has
served, and takes back the sandboxes of reusable envs for up to `sandbox_reuse` trajectories each. A user's
`py:` env gets its image layer from its package in the object store on first use (`trajflow/sandbox/user/`,
`trajflow/sandbox/user_images.py`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from temporalio.client import Client
from temporalio.worker import Worker

from trajflow.activities.env import EnvActivities
from trajflow.contracts import names
from trajflow.infra.settings import Settings
from trajflow.infra.store import open_store_from
from trajflow.sandbox.images import ImageResolver
from trajflow.sandbox.manager import SandboxLimits, SandboxManager
from trajflow.sandbox.pool import WarmPool
from trajflow.sandbox.user.packages import unpack
from trajflow.workers.common import connect_worker, new_worker_id, run_until_signalled
from trajflow.workers.sandbox_sweep import Sweeper

log = logging.getLogger("trajflow.env")


def env_workers(
    client: Client,
    manager: SandboxManager,
    pools: Sequence[str],
    worker_id: str,
    step_timeout_s: float,
    max_resets: int = 16,
    warm: WarmPool | None = None,
    images: ImageResolver | None = None,
) -> list[Worker]:
    workers = []
    for pool in pools:
        acts = EnvActivities(manager, pool, worker_id, step_timeout_s, warm, images)
        workers.append(
            Worker(
                client, task_queue=names.env_queue(pool), activities=[acts.reset], max_concurrent_activities=max_resets
            )
        )
        workers.append(
            Worker(
                client, task_queue=acts.host_queue, activities=[acts.step, acts.close], max_concurrent_activities=256
            )
        )
    return workers


def build_manager(settings: Settings, worker_id: str) -> SandboxManager:
    import docker

    from trajflow.sandbox.images import ensure_runtime_image
    from trajflow.sandbox.reaper import own_container

    client = docker.from_env()
    image = ensure_runtime_image(client, settings.cache_dir / "images", progress=log.info)
    limits = SandboxLimits(
        network_disabled=not settings.sandbox_network,
        mem_limit=settings.sandbox_mem_limit,
        cpus=settings.sandbox_cpus,
        pids_limit=settings.sandbox_pids_limit,
    )
    return SandboxManager(
        client,
        image,
        settings.sandbox_dir,
        worker_id,
        limits=limits,
        step_timeout_s=settings.sandbox_step_timeout_s,
        host_name=settings.host_name or "",
        owner_container=own_container(client),
    )


async def serve(settings: Settings, pools: Sequence[str]) -> None:
    worker_id = new_worker_id()
    manager = await asyncio.to_thread(build_manager, settings, worker_id)
    client = await connect_worker(settings, "env")

    warm = WarmPool(  # fills per env on first use; the sweep forgets envs unused for a while
        manager,
        settings.sandbox_warm_pool,
        reuse=settings.sandbox_reuse,
        unused_s=settings.sandbox_warm_unused_s,
        max_waiting=settings.sandbox_warm_max,
    )
    sweeper = Sweeper(manager, client, settings.sandbox_lease_s, warm)
    await sweeper.sweep_logged()  # dead workers' orphans go before this worker starts sandboxes of its own
    sweeping = asyncio.create_task(sweeper.run_forever())
    store = open_store_from(settings)  # where `py:` envs' packages are (trajflow/sandbox/user/)
    image_cache = settings.cache_dir / "images"
    images = ImageResolver(
        manager.client, image_cache, progress=log.info, unpack=lambda uri: unpack(store, uri, image_cache)
    )

    async def close_all() -> None:
        sweeping.cancel()
        await asyncio.to_thread(warm.close)
        await asyncio.to_thread(manager.close_all)

    workers = env_workers(client, manager, pools, worker_id, settings.sandbox_step_timeout_s, warm=warm, images=images)
    await run_until_signalled(workers, on_stop=close_all)
