"""The benchmarks' simulated trainer honours the real trainer activity's contract: it sleeps the run's step time,
records the step and publishes the version (pointer only), and a retried step returns the recorded result; a sharded
step trains on its group manifests as the real trainer does (`trajflow.activities.batches.step_refs`).
Also: inputs recorded with the removed `TrainerConfig.simulate_step_s` still decode."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from trajflow.contracts import names
from trajflow.contracts.shards import BatchStats, GroupManifest
from trajflow.contracts.steps import TaskStats
from trajflow.contracts.training import TrainerConfig, TrainingRunConfig, TrainRef, TrainStepInput, TrainStepResult
from trajflow.infra import layout
from trajflow.infra.policies import PolicyStore
from trajflow.infra.store import LocalStore
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
    assert result.version == 1 and result.weights_uri is None
    m = result.metrics
    assert m["simulated"] == 1.0 and m["compute_s"] >= 0.2 and 0 <= m["load_s"] < m["compute_s"], m
    assert result.seconds >= m["load_s"] + m["compute_s"]
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


async def test_a_sharded_step_trains_on_its_group_manifests(acts: SimulatedTrainerActivities) -> None:
    """A step of a sharded run: the refs it carries, then its groups' manifests read from the store; the result
    carries the batch figures of all of them (by hand: `BatchStats.of` has its own test), and so does the record a
    retried step reads back."""

    def member(i: int, group: str, reward: float, version: int, task: str, won: bool = False) -> TrainRef:
        uri = f"file:///s/{group}-{i}.json"
        return TrainRef(
            workflow_id=f"{group}-{i}", trajectory_uri=uri, group=group, reward=reward, policy_version=version,
            task=task, won=won,
        )  # fmt: skip

    own = member(0, "user", 0.5, 2, "t")
    groups = {
        1: GroupManifest(run_id="r4", k=1, refs=[member(0, "g1", 1.0, 3, "t", won=True), member(1, "g1", 0.0, 3, "t")]),
        2: GroupManifest(run_id="r4", k=2, refs=[member(0, "g2", 1.0, 1, "u", won=True)]),
    }
    for group in groups.values():
        acts.store.put_json(layout.group_manifest_key("r4", group.k), group)
    inp = TrainStepInput(run_id="r4", version=3, refs=[own], trainer=TrainerConfig(), groups=[(1, 3)])
    result = await ActivityEnvironment().run(acts.train_step, inp)
    assert result.batch == BatchStats(
        trajectories=4,
        reward_mean=0.625,  # (0.5 + 1 + 0 + 1) / 4
        wins=2,
        staleness={0: 2, 1: 1, 2: 1},  # lags 3-2, 3-3, 3-3, 3-1
        by_task={
            "t": TaskStats(trajectories=3, reward_mean=0.5, wins=1),
            "u": TaskStats(trajectories=1, reward_mean=1.0, wins=1),
        },
    )
    again = await ActivityEnvironment().run(acts.train_step, inp)
    assert again.resumed and again.batch == result.batch


async def test_a_sharded_step_without_its_manifest_fails_by_name(acts: SimulatedTrainerActivities) -> None:
    inp = TrainStepInput(run_id="r5", version=0, refs=[], trainer=TrainerConfig(), groups=[(0, 1)])
    with pytest.raises(ApplicationError) as failed:
        await ActivityEnvironment().run(acts.train_step, inp)
    assert failed.value.type == names.ERR_BAD_REQUEST and failed.value.non_retryable
    assert "g000000" in str(failed.value) and "runs/r5/groups/g000000.json" in str(failed.value)
    assert acts.policies.latest_version("r5", fresh=True) == 0  # nothing published
