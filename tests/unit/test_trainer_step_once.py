"""The trainer activity answers a step issued again while it still trains that step (its training workflow
continued as new mid-step and issued it anew) with that one step's result, and a step already published from
its record: a step is never trained twice. The step's training is replaced by a short sleep that publishes a
pointer-only version, so no model is needed; the de-duplication and the record around it are the real ones. And a
sharded step whose group manifest is missing fails without retry."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from trajflow.activities.trainer import TrainerActivities
from trajflow.contracts import names
from trajflow.contracts.shards import GroupManifest
from trajflow.contracts.training import TrainerConfig, TrainRef, TrainStepInput, TrainStepResult
from trajflow.infra.layout import group_manifest_key
from trajflow.infra.policies import PolicyStore
from trajflow.infra.store import LocalStore


async def test_a_step_issued_again_while_it_trains_is_answered_once(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    trainer = TrainerActivities(
        store, PolicyStore(store, tmp_path / "cache", pointer_ttl_s=0.0), Path("/none"), tmp_path
    )
    calls = 0

    def counted(inp: TrainStepInput) -> TrainStepResult:  # runs on the trainer's executor thread, as _train does
        nonlocal calls
        calls += 1
        time.sleep(0.3)
        result = TrainStepResult(version=inp.version + 1, weights_uri=None, seconds=0.3)
        trainer._publish(inp.run_id, result, None)
        return result

    trainer._train = counted
    ref = TrainRef(workflow_id="w", trajectory_uri="file:///w", group="g000000", reward=1.0, policy_version=0)
    inp = TrainStepInput(run_id="run", version=0, refs=[ref], trainer=TrainerConfig())
    first, again = await asyncio.gather(
        ActivityEnvironment().run(trainer.train_step, inp), ActivityEnvironment().run(trainer.train_step, inp)
    )
    assert calls == 1 and first == again and first.version == 1
    later = await ActivityEnvironment().run(trainer.train_step, inp)  # a retry after it was published
    assert calls == 1 and later.resumed and later.version == 1


async def test_a_sharded_step_without_a_manifest_fails_without_retry(tmp_path: Path) -> None:
    """The real step's reads (no model needed: the missing manifest fails it before anything is trained)."""
    store = LocalStore(tmp_path / "store")
    trainer = TrainerActivities(
        store, PolicyStore(store, tmp_path / "cache", pointer_ttl_s=0.0), Path("/none"), tmp_path
    )
    ref = TrainRef(workflow_id="w", trajectory_uri="file:///w", group="g000000", reward=1.0, policy_version=0)
    store.put_json(group_manifest_key("run", 0), GroupManifest(run_id="run", k=0, refs=[ref]))
    inp = TrainStepInput(run_id="run", version=0, refs=[], trainer=TrainerConfig(), groups=[(0, 2)])
    with pytest.raises(ApplicationError) as failed:
        await ActivityEnvironment().run(trainer.train_step, inp)
    assert failed.value.type == names.ERR_BAD_REQUEST and failed.value.non_retryable
    assert "g000001" in str(failed.value) and "runs/run/groups/g000001.json" in str(failed.value)
