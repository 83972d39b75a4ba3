"""Held-out evaluation of a policy version: greedy rollouts of the held-out seeds (`[train.eval]`, disjoint from
the training seeds by validation) as ordinary trajectories pinned to a policy version; success = the episode's last
env reward is at least 1 (a win), and the mean reward is reported beside it. `trajflow train` evaluates with it
before and after training.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable

from temporalio.client import Client

from contracts.records import TrajectoryRecord
from contracts.runs import EvalResult
from contracts.training import TrainingRunConfig
from contracts.trajectory import SamplingParams, TrajectoryStatus
from infra.store import ObjectStore
from trajflow.client import start_trajectory

Say = Callable[[str], None]


async def evaluate(
    client: Client, store: ObjectStore, run: TrainingRunConfig, policy: str, version: int, say: Say
) -> EvalResult:
    """Greedy rollouts of the held-out seeds with `policy` at `version` (0: the initial model)."""
    n = run.eval.episodes
    started = time.monotonic()
    handles = []
    for i in range(n):
        task = run.tasks[i % len(run.tasks)]
        req = task.request(
            run.eval.first_seed + i,
            sampling=SamplingParams(**{**task.sampling.model_dump(), "temperature": 0.0}),
            policy=policy,
            min_policy_version=version,
            group=f"eval-v{version}",
        )
        handles.append(await start_trajectory(req, client=client, workflow_id=f"{policy or 'base'}-eval-v{version}-{i}"))
    results = await asyncio.gather(*(h.result() for h in handles))
    wins, rewards, lost = 0, [], 0
    for res in results:
        if res.status is not TrajectoryStatus.COMPLETED or res.trajectory_uri is None:
            lost += 1
            continue
        record = TrajectoryRecord.model_validate(await asyncio.to_thread(store.get_json, res.trajectory_uri))
        wins += bool(record.turns and record.turns[-1].env_reward >= 1.0)
        rewards.append(res.reward or 0.0)
    out = EvalResult(
        version=version,
        episodes=n,
        scored=len(rewards),
        not_completed=lost,
        success_rate=wins / n if n else 0.0,
        mean_reward=statistics.fmean(rewards) if rewards else 0.0,
        seconds=round(time.monotonic() - started, 1),
    )
    say(
        f"eval v{version}: success {wins}/{n} ({out.success_rate:.0%}), mean reward {out.mean_reward:.3f} "
        f"({out.seconds:.0f}s)"
    )
    return out
