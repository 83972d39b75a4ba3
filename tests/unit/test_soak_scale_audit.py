"""The arithmetic of `bench soak --scale` (no Temporal): the loss audit of a sharded run, each step's time taken apart,
and the signals a step."""

from __future__ import annotations

from trajflow.contracts.shards import IndexSet, ShardedState
from trajflow.contracts.steps import StepRecord
from trajflow.contracts.trainer import TrainerConfig
from trajflow.contracts.training import TrainingCounters, TrainingResult, TrainingState, TrainStepInput
from trajflow.lab.bench.soak_scale import ScaleSoak, breakdown, signals_a_step
from trajflow.lab.bench.soak_scale_audit import Closed, RunHistory, audit_sharded

B, N, STEPS = 16, 8, 3  # two groups a step


def _run(groups: list[list[tuple[int, int]]]) -> tuple[TrainingResult, TrainingState, RunHistory, Closed]:
    records = [
        StepRecord(step=v, time_s=10.0 * v, reward_mean=1.0, trajectories=B, stale_dropped_total=0) for v in (1, 2, 3)
    ]
    counters = TrainingCounters(started=STEPS * B, completed=STEPS * B, consumed=STEPS * B)
    result = TrainingResult(run_id="r", version=STEPS, counters=counters, history=records, wall_seconds=30.0)
    state = TrainingState(run_id="r", version=STEPS, next_group=6, sharded=ShardedState())
    steps = {
        v: TrainStepInput(run_id="r", version=v, refs=[], trainer=TrainerConfig(), groups=g)
        for v, g in enumerate(groups)
    }
    closed = Closed({"COMPLETED": STEPS * B}, {"COMPLETED": 3})
    return result, state, RunHistory(runs=["a", "b", ""], steps=steps), closed


def test_a_sharded_run_that_trained_every_group_once_passes() -> None:
    assert audit_sharded(*_run([[(0, 2)], [(2, 4)], [(4, 6)]]), STEPS, B, N) == []


def test_a_group_trained_twice_or_never_is_reported() -> None:
    problems = audit_sharded(*_run([[(0, 2)], [(1, 3)], [(4, 6)]]), STEPS, B, N)
    assert any("groups [1] trained more than once" in p for p in problems), problems
    assert any("1 groups admitted and never trained (first [3])" in p for p in problems), problems


def test_a_lost_or_running_trajectory_a_missing_step_and_open_groups_are_reported() -> None:
    result, state, history, closed = _run([[(0, 2)], [(2, 4)], [(4, 6)]])
    closed.trajectories = {"COMPLETED": STEPS * B - 2, "RUNNING": 1}
    del history.steps[2]
    assert state.sharded is not None
    state.sharded.open = IndexSet.of([6])
    problems = audit_sharded(result, state, history, closed, STEPS, B, N)
    assert any("visibility holds 47" in p for p in problems), problems
    assert any("still running: 1" in p for p in problems), problems
    assert any("not 0..2" in p for p in problems), problems
    assert any("left open" in p for p in problems), problems


def test_each_step_is_taken_apart_and_signals_averaged() -> None:
    records = [
        StepRecord(step=1, time_s=12.0, reward_mean=0, trajectories=B, stale_dropped_total=0, train_s=1.5,
                   metrics={"load_s": 0.5, "compute_s": 1.0}),
        StepRecord(step=2, time_s=20.0, reward_mean=0, trajectories=B, stale_dropped_total=0, train_s=1.2,
                   metrics={"load_s": 0.2, "compute_s": 1.0}),
    ]  # fmt: skip
    steps = breakdown(records, {1: (112.0, 600), 2: (120.0, 1000)}, start=100.0)
    assert steps[0] | {"activities_per_s": 50.0} == {
        "step": 1, "wall_s": 12.0, "load_s": 0.5, "compute_s": 1.0, "rest_s": 10.5, "trainer_s": 1.5,
        "trajectories": B, "activities": 600, "activities_per_s": 50.0,
    }  # fmt: skip
    assert steps[1]["wall_s"] == 8.0 and steps[1]["rest_s"] == 6.8 and steps[1]["activities_per_s"] == 50.0
    buckets = [{"group_finished": 200}, {}, {"group_finished": 184, "shard_finished": 4}]
    assert signals_a_step(buckets, 3) == {"group_finished": 128.0, "shard_finished": 1.3}


def test_the_scale_mode_continues_as_new_about_once_a_step() -> None:
    assert ScaleSoak().events() == 2_048 and ScaleSoak(batch_size=64).events() == 100
    assert ScaleSoak(history_events=999).events() == 999
