"""Where a run's seed goes (contracts and the training bookkeeping, no Temporal): one sampling seed per trajectory
from the run seed, the group's env seed and the member's index, one per turn from that, the trainer's seed from the
run's, and each step's samples in member order whatever order they finished in."""

from __future__ import annotations

import pytest

from tests.unit.test_training_bookkeeping import admit, report
from trajflow.contracts.config import parse_run_config
from trajflow.contracts.tasks import TaskConfig
from trajflow.contracts.training import TrainerConfig, TrainingRunConfig, TrainingState, TrainSettings
from trajflow.contracts.trajectory import SEED_BITS, SamplingParams, TrajectoryRequest, derive_seed
from trajflow.workflows.bookkeeping import Book


def test_derived_seeds_are_stable_and_json_safe() -> None:
    # fixed values: a change here silently changes every seeded run, so it must be deliberate
    assert derive_seed(0, 0, 0) == 2225151987610704
    assert derive_seed(7) == 8138597842145041
    seeds = {derive_seed(run, group, member) for run in range(3) for group in range(20) for member in range(5)}
    assert len(seeds) == 300 and all(0 <= s < 2**SEED_BITS for s in seeds)
    assert derive_seed(1, 23) != derive_seed(12, 3)  # parts are separated, not concatenated


def test_each_turn_samples_with_its_own_seed() -> None:
    unseeded = SamplingParams()
    assert unseeded.for_turn(3) is unseeded and unseeded.unseeded() is unseeded
    seeded = SamplingParams(temperature=0.7, seed=42)
    turns = [seeded.for_turn(t) for t in range(4)]
    assert [t.seed for t in turns] == [derive_seed(42, t) for t in range(4)]
    assert all(t.unseeded() == seeded.unseeded() for t in turns)  # only the seed differs: they batch together
    req = TrajectoryRequest(sampling=seeded)
    assert req.generate_input("wf/run", 2, None, "obs").sampling.seed == derive_seed(42, 2)
    assert TrajectoryRequest().generate_input("wf/run", 2, None, "obs").sampling.seed is None


def test_a_negative_seed_is_refused_with_its_field_named() -> None:
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=-1)


def test_member_seeds_differ_within_a_group_and_follow_the_run_seed() -> None:
    run = TrainingRunConfig(seed=5)
    members = [run.member_seed(100, i) for i in range(4)]
    assert len(set(members)) == 4
    assert members == [TrainingRunConfig(seed=5).member_seed(100, i) for i in range(4)]  # no hidden state
    assert run.member_seed(101, 0) != members[0]
    assert TrainingRunConfig(seed=6).member_seed(100, 0) != members[0]


def test_the_trainer_seed_follows_the_run_seed() -> None:
    cfg = parse_run_config("[train]\nseed = 3\n", "test")
    assert cfg.train.seed == 3 and cfg.training_run().seed == 3
    assert TrainSettings(seed=3, trainer=TrainerConfig(seed=3)).trainer.seed == 3  # equal is fine
    with pytest.raises(ValueError, match=r"trainer.seed \(7\) differs from the run's seed \(3\)"):
        parse_run_config("[train]\nseed = 3\ntrainer = { seed = 7 }\n", "test")


def test_a_step_trains_its_groups_in_member_order_with_the_run_seed() -> None:
    b = Book(TrainingRunConfig(steps=2, batch_size=4, group_size=2, alpha=0, sync=True, seed=9, tasks=[TaskConfig()]),
             TrainingState(run_id="run"))  # fmt: skip
    groups = admit(b)
    for wid in [groups[1][1], groups[0][1], groups[1][0], groups[0][0]]:  # finished out of order
        b.report(report(wid))
    step = b.take_batch()
    assert step is not None
    assert [r.workflow_id for r in step.refs] == [*groups[0], *groups[1]]
    assert step.trainer.seed == 9 and b.cfg.trainer.seed == 0  # the step's input carries it; the config is as given


def test_member_order_is_by_index_past_ten_members() -> None:
    b = Book(TrainingRunConfig(steps=1, batch_size=12, group_size=12, alpha=0, sync=True, tasks=[TaskConfig()]),
             TrainingState(run_id="run"))  # fmt: skip
    (members,) = admit(b)
    for wid in reversed(members):
        b.report(report(wid))
    step = b.take_batch()
    assert step is not None and [r.workflow_id for r in step.refs] == members  # run-g000000-2 before ...-10
