"""`trajflow bench pipeline` end to end, and the BatchRolloutWorkflow it compares against, on the real Temporal
dev server and the real reward service (the engine and the env are the simulated ones the bench uses)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from temporalio.worker import Worker
from transformers import AutoTokenizer

from tests.conftest import ROOT
from trajflow.client import run_trajectory
from trajflow.contracts.tasks import TaskConfig
from trajflow.contracts.trajectory import SamplingParams, StagePools, TrajectoryStatus
from trajflow.lab.bench.batch_rollout import BatchRolloutWorkflow
from trajflow.lab.bench.contracts import BATCH_ROLLOUT_WORKFLOW, BatchRolloutInput, BatchRolloutResult
from trajflow.lab.bench.sim_engine import SimulatedEngine
from trajflow.lab.bench.synthetic_env import ENV_ID, SyntheticEpisode, SyntheticSpec, episode_seed
from trajflow.lab.bench.synthetic_worker import synthetic_env_workers
from trajflow.rewards.client import RewardClient
from trajflow.workers.decode import decode_workers
from trajflow.workers.reward import reward_workers
from trajflow.workflows.trajectory import TrajectoryWorkflow

pytestmark = pytest.mark.integration


async def test_batch_rollout_runs_every_episode_in_lockstep(temporal_env, reward_service, store, tiny_model) -> None:
    client = temporal_env.client
    tag = uuid.uuid4().hex[:8]
    pool, queue = f"b{tag}", f"trajflow-test-{tag}"
    engine = SimulatedEngine(AutoTokenizer.from_pretrained(tiny_model), slots=4, unit_s=0.005, seed=1)
    await engine.start()
    reward_client = RewardClient(reward_service)
    workers = [Worker(client, task_queue=queue, workflows=[TrajectoryWorkflow, BatchRolloutWorkflow])]
    workers += decode_workers(client, engine, store, [pool], f"d{tag}")
    workers += synthetic_env_workers(client, [pool], f"e{tag}", unit_s=0.005)
    workers += reward_workers(client, reward_client, store, [pool])
    tasks = [asyncio.create_task(w.run()) for w in workers]
    spec = SyntheticSpec(mean=1.0, sigma=1.0)
    task = TaskConfig(
        env_id=ENV_ID,
        env_kwargs=spec.as_kwargs(),
        max_turns=8,
        sampling=SamplingParams(max_new_tokens=8),
        pools=StagePools(decode=pool, env=pool, reward=pool),
    )
    reqs = [task.request(100 + i) for i in range(8)]
    ids = [f"ep-{tag}-{i}" for i in range(8)]
    try:
        batch = await client.execute_workflow(
            BATCH_ROLLOUT_WORKFLOW,
            BatchRolloutInput(requests=reqs, episode_ids=ids),
            id=f"batch-{tag}",
            task_queue=queue,
            result_type=BatchRolloutResult,
        )
        # the same episodes, one TrajectoryWorkflow each (workflow id = episode id): the same lengths
        singles = await asyncio.gather(
            *(run_trajectory(r, client=client, task_queue=queue, workflow_id=i) for r, i in zip(reqs, ids, strict=True))
        )
    finally:
        await asyncio.gather(*(w.shutdown() for w in workers), return_exceptions=True)
        for t in tasks:
            t.cancel()
        await reward_client.close()
    expected = [SyntheticEpisode(spec, episode_seed(r.seed, i)).turns for r, i in zip(reqs, ids, strict=True)]
    assert batch.episodes == 8 and batch.completed == 8
    assert batch.turns == expected and batch.rounds == max(expected)
    assert all(r is not None for r in batch.rewards)
    assert [s.turns for s in singles] == expected
    assert all(s.status is TrajectoryStatus.COMPLETED for s in singles)
    assert engine.stats()["peak_active"] <= 4


def test_quick_bench_writes_the_figures(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    started = time.monotonic()
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "trajflow"), "bench", "pipeline", "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-4000:]
    s = json.loads(out.read_text())
    assert isinstance(s["sync_tps"], float) and s["sync_tps"] > 0
    assert set(s["async_tps"]) == {"1", "2"} and all(isinstance(v, float) and v > 0 for v in s["async_tps"].values())
    assert set(s["speedup"]) == {"1", "2"} and all(v > 0 for v in s["speedup"].values())
    assert isinstance(s["ideal_tps"], float) and s["ideal_tps"] > 0
    assert isinstance(s["efficiency"], float) and s["efficiency"] > 0
    assert set(s["traj_vs_batch"]) == {"1", "10"}
    assert all(v["ratio"] > 0 and v["traj_tps"] > 0 and v["batch_tps"] > 0 for v in s["traj_vs_batch"].values())
    assert s["workload"]["batch_size"] == 8 and s["workload"]["quick"] is True
    assert "SYNTHETIC" in proc.stdout and "B=8" in proc.stdout
    assert took < 90, f"--quick took {took:.0f} s"
