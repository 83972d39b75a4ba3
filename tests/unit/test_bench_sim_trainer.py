"""The benchmarks' simulated trainer honours the real trainer activity's contract: it sleeps the run's step time,
records the step and publishes the version (pointer only), and a retried step returns the recorded result.
Also: inputs recorded with the removed `TrainerConfig.simulate_step_s` still decode."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from infra import layout
from infra.policies import PolicyStore
from infra.store import LocalStore
from trajflow.contracts.training import TrainerConfig, TrainingRunConfig, TrainRef, TrainStepInput, TrainStepResult
from trajflow.lab.bench.sim_trainer import SimulatedTrainerActivities


def step(run_id: str, version: int, refs: int = 1) -> TrainStepInput:
    ref = TrainRef(workflow_id="w", trajectory_uri="file:///s/w.json", group="g0", reward=1.0, policy_version=0)
    return TrainStepInput(run_id=run_id, version=version, refs=[ref] * refs, trainer=TrainerConfig())


@pytest.fixture()
def acts(tmp_path: Path) -> SimulatedTrainerActivities:
    store = LocalStore(tmp_path / "store")
    return SimulatedTrainerActivities(store, PolicyStore(store, tmp_path / "cache", pointer_ttl_s=0.0))


async def test_a_step_sleeps_records_and_publishes(acts: SimulatedTrainerActivities) -> None:
    acts.set_step_s("r1", 0.2)
    t0 = time.monotonic()
    result = await ActivityEnvironment().run(acts.train_step, step("r1", 0))
    assert time.monotonic() - t0 >= 0.2
    assert result.version == 1 and result.weights_uri is None and result.metrics == {"simulated": 1.0}
    assert acts.policies.latest_version("r1", fresh=True) == 1
    recorded = acts.store.get_json(acts.store.uri_for(layout.step_key("r1", 1)))
    assert TrainStepResult.model_validate(recorded) == result


async def test_a_retried_step_returns_the_recorded_result(acts: SimulatedTrainerActivities) -> None:
    first = await ActivityEnvironment().run(acts.train_step, step("r2", 0))
    again = await ActivityEnvironment().run(acts.train_step, step("r2", 0))
    assert again == first.model_copy(update={"resumed": True})


async def test_a_step_without_trajectories_is_a_bad_request(acts: SimulatedTrainerActivities) -> None:
    with pytest.raises(ApplicationError, match="at least one trajectory"):
        await ActivityEnvironment().run(acts.train_step, step("r3", 0, refs=0))


def test_inputs_recorded_with_simulate_step_s_still_decode() -> None:
    assert TrainerConfig.model_validate({"simulate_step_s": 0.1, "lr": 0.5}) == TrainerConfig(lr=0.5)
    run = TrainingRunConfig.model_validate({"trainer": {"simulate_step_s": 0.0}})
    assert run.trainer == TrainerConfig()
    assert "simulate_step_s" not in TrainerConfig().model_dump()
