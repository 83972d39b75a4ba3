"""Sandbox container kills during a chaos run: a share of the run's episodes lose their container mid-episode."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from trajflow.contracts import names
from trajflow.contracts.trajectory import TrajectoryProgress


@dataclass
class ContainerKills:
    episodes_seen: int = 0
    targeted: int = 0
    killed: int = 0
    ended_before_kill: int = 0
    killed_ids: list[str] = field(default_factory=list)


async def kill_sandboxes(
    client, run_id: str, kills: ContainerKills, done: asyncio.Event, *, kill_rate: float, rng: random.Random
) -> None:
    """Pick `kill_rate` of the run's episodes; kill each one's sandbox container once the episode has one, until
    `done`. Counts go into `kills`."""
    import docker

    from trajflow.sandbox.labels import SANDBOX_ID

    engine = docker.from_env()
    decided: dict[str, bool] = {}
    query = (
        f"WorkflowType = '{names.TRAJECTORY_WORKFLOW}' AND {names.SA_RUN} = '{run_id}' AND ExecutionStatus = 'Running'"
    )
    while not done.is_set():
        try:
            running = [wf.id async for wf in client.list_workflows(query)]
        except Exception:
            running = []
        for wid in running:
            if wid not in decided:
                decided[wid] = rng.random() < kill_rate
                kills.episodes_seen += 1
                kills.targeted += decided[wid]
            if not decided[wid] or wid in kills.killed_ids:
                continue
            try:
                p = await client.get_workflow_handle(wid).query(names.QUERY_PROGRESS, result_type=TrajectoryProgress)
            except Exception:
                continue
            if p.sandbox:
                found = await asyncio.to_thread(engine.containers.list, filters={"label": f"{SANDBOX_ID}={p.sandbox}"})
                for container in found:
                    await asyncio.to_thread(container.kill)
                if found:
                    kills.killed += 1
                    kills.killed_ids.append(wid)
        await sleep_or(done, 0.5)
    kills.ended_before_kill = kills.targeted - kills.killed


async def sleep_or(event: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or less if `event` is set meanwhile."""
    try:
        await asyncio.wait_for(event.wait(), timeout=seconds)
    except TimeoutError:
        pass
