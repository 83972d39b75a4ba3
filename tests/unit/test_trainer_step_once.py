"""The trainer activity answers a step issued again while it still trains that step (its training workflow
continued as new mid-step and issued it anew) with that one step's result, and a step already published from
its record: a step is never trained twice. Simulated steps, so no model is needed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio.testing import ActivityEnvironment

from activities.trainer import TrainerActivities
from contracts.training import TrainerConfig, TrainRef, TrainStepInput
from infra.policies import PolicyStore
from infra.store import LocalStore


async def test_a_step_issued_again_while_it_trains_is_answered_once(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    trainer = TrainerActivities(store, PolicyStore(store, tmp_path / "cache", pointer_ttl_s=0.0), Path("/none"), tmp_path)
    calls = 0
    simulated = trainer._simulated

    async def counted(inp: TrainStepInput):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return await simulated(inp)

    trainer._simulated = counted  # type: ignore[method-assign]
    ref = TrainRef(workflow_id="w", trajectory_uri="file:///w", group="g000000", reward=1.0, policy_version=0)
    inp = TrainStepInput(run_id="run", version=0, refs=[ref], trainer=TrainerConfig(simulate_step_s=0.3))
    first, again = await asyncio.gather(
        ActivityEnvironment().run(trainer.train_step, inp), ActivityEnvironment().run(trainer.train_step, inp)
    )
    assert calls == 1 and first == again and first.version == 1
    later = await ActivityEnvironment().run(trainer.train_step, inp)  # a retry after it was published
    assert calls == 1 and later.resumed and later.version == 1
