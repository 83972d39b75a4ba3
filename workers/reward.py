"""Reward worker: the stateless pool that scores trajectories through the reward service and saves them (and a sharded
run's group manifests)."""

from __future__ import annotations

from collections.abc import Sequence

from temporalio.client import Client
from temporalio.worker import Worker

from trajflow.activities.reward import RewardActivities
from trajflow.contracts import names
from trajflow.infra.settings import Settings
from trajflow.infra.store import ObjectStore, open_store_from
from trajflow.rewards.client import RewardClient
from trajflow.workers.common import connect_worker, run_until_signalled


def reward_workers(
    client: Client, reward_client: RewardClient, store: ObjectStore, pools: Sequence[str]
) -> list[Worker]:
    acts = RewardActivities(reward_client, store)
    return [
        Worker(
            client,
            task_queue=names.reward_queue(pool),
            activities=[acts.score, acts.save, acts.branch, acts.save_group],
            max_concurrent_activities=64,
        )
        for pool in pools
    ]


async def serve(settings: Settings, pools: Sequence[str]) -> None:
    store = open_store_from(settings)
    reward_client = RewardClient(settings.resolved_reward_url, timeout_s=settings.reward_timeout_s)
    client = await connect_worker(settings, "reward")
    await run_until_signalled(reward_workers(client, reward_client, store, pools), on_stop=reward_client.close)
