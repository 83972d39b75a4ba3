"""A step's batch figures as the trainer returns them (`BatchStats.of`): counted by hand here, and the same as the
training workflow's own step record of a direct run; they survive the JSON of a published step result."""

from __future__ import annotations

from trajflow.contracts.shards import BatchStats
from trajflow.contracts.steps import TaskStats, TrainRef
from trajflow.contracts.tasks import TaskConfig
from trajflow.contracts.training import TrainerConfig, TrainingRunConfig, TrainingState, TrainStepInput, TrainStepResult
from trajflow.workflows.bookkeeping import Book


def ref(i: int, task: str, reward: float, version: int, won: bool = False) -> TrainRef:
    return TrainRef(
        workflow_id=f"w{i}",
        trajectory_uri=f"file:///s/w{i}.json",
        group=f"g{i // 2:06d}",
        reward=reward,
        policy_version=version,
        task=task,
        won=won,
    )


REFS = [
    ref(0, "a", 1.0, 2, won=True),
    ref(1, "a", 0.0, 1),
    ref(2, "b", 0.5, 3, won=True),
    ref(3, "b", 0.25, 1),
]


def test_batch_stats_counted_by_hand() -> None:
    stats = BatchStats.of(REFS, version=3)
    assert stats.trajectories == 4
    assert stats.reward_mean == 0.4375  # (1 + 0 + 0.5 + 0.25) / 4
    assert stats.wins == 2
    assert stats.staleness == {0: 1, 1: 1, 2: 2}  # lags 3-2, 3-1, 3-3, 3-1
    assert list(stats.staleness) == [0, 1, 2]
    assert stats.by_task == {
        "a": TaskStats(trajectories=2, reward_mean=0.5, wins=1),
        "b": TaskStats(trajectories=2, reward_mean=0.375, wins=1),
    }


def test_the_same_figures_as_a_direct_runs_step_record() -> None:
    """What a sharded run's step record is made of matches what a direct run's training workflow counts itself."""
    cfg = TrainingRunConfig(tasks=[TaskConfig(name="a"), TaskConfig(name="b")])
    step = TrainStepInput(run_id="run", version=3, refs=REFS, trainer=TrainerConfig())
    record = Book(cfg, TrainingState(run_id="run", version=3)).finish_step(
        step, TrainStepResult(version=4, weights_uri=None), time_s=1.0
    )
    stats = BatchStats.of(REFS, version=3)
    assert (record.trajectories, record.reward_mean, record.wins) == (stats.trajectories, stats.reward_mean, stats.wins)
    assert (record.staleness, record.by_task) == (stats.staleness, stats.by_task)


def test_no_samples_are_zeros() -> None:
    assert BatchStats.of([], version=5) == BatchStats(trajectories=0, reward_mean=0.0)


def test_batch_stats_round_trip_through_a_published_result() -> None:
    result = TrainStepResult(version=4, weights_uri=None, batch=BatchStats.of(REFS, version=3))
    assert TrainStepResult.model_validate_json(result.model_dump_json()) == result
    older = TrainStepResult.model_validate_json('{"version": 4, "weights_uri": null, "metrics": {}, "seconds": 1.0}')
    assert older.batch is None  # a step published before the trainer returned its batch still reads
