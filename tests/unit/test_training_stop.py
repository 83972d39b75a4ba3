"""Ending a training run early (`Book.stop`, `Book.stop_due`; the `stop` signal, `trajflow stop`), without
Temporal: which version the run ends at, what is cancelled, and that admission and replacements end."""

from __future__ import annotations

from tests.unit.test_training_bookkeeping import admit, book, report, train
from trajflow.contracts.training import StopRequest, TrainStepResult
from trajflow.contracts.trajectory import TrajectoryStatus


def test_a_graceful_stop_trains_the_batch_the_running_groups_can_still_fill() -> None:
    b = book(steps=10, batch_size=4, group_size=2, alpha=1)
    groups = admit(b)  # 4 groups of 2: two batches' worth, all running
    assert b.stop(StopRequest())
    assert b.s.stopping is not None and b.s.stopping.at_version == 1
    assert b.groups_to_admit() == 0 and not b.to_cancel  # nothing more admitted, nothing cancelled yet
    assert not b.stop_due()  # the running groups can fill the current batch
    for wid in groups[0] + groups[1]:
        b.report(report(wid))
    train(b)
    assert b.s.version == 1 and b.stop_due()  # the current step is trained: the run ends
    b.cancel_leftovers()
    assert sorted(b.to_cancel) == sorted(groups[2] + groups[3])


def test_a_graceful_stop_ends_at_once_when_no_batch_can_fill() -> None:
    b = book(steps=10, batch_size=4, group_size=2, alpha=0)
    groups = admit(b)  # 2 groups: one batch
    b.report(report(groups[0][0], TrajectoryStatus.INFRA_FAILED))  # group 0 can no longer reach 2 samples
    b.stop(StopRequest())
    assert not b.replacements  # replacements end with admission
    assert b.stop_due() and b.s.version == 0


def test_a_stop_while_a_step_trains_ends_after_that_step_now_or_not() -> None:
    for now in (False, True):
        b = book(steps=10, batch_size=2, group_size=2, alpha=2)
        groups = admit(b)
        for wid in groups[0]:
            b.report(report(wid))
        step = b.take_batch()
        assert step is not None and b.training
        b.stop(StopRequest(now=now))
        assert b.s.stopping is not None and b.s.stopping.at_version == 1
        assert not b.stop_due()  # the step in flight is trained first
        assert bool(b.to_cancel) is now  # now: the running members are cancelled at once
        b.finish_step(step, TrainStepResult(version=1, weights_uri=None), time_s=1.0)
        assert b.stop_due()


def test_stop_now_cancels_every_running_member_and_ends_at_the_current_version() -> None:
    b = book(steps=10, batch_size=4, group_size=2, alpha=1, redundancy=1)
    groups = admit(b)
    assert b.stop(StopRequest(now=True, reason="out of budget"))
    assert sorted(b.to_cancel) == sorted(w for g in groups for w in g)
    assert b.stop_due() and b.s.stopping is not None and b.s.stopping.at_version == 0
    assert b.s.stopping.reason == "out of budget"


def test_now_after_graceful_takes_over_and_a_second_graceful_changes_nothing() -> None:
    b = book(steps=10, batch_size=4, group_size=2, alpha=1)
    admit(b)
    assert b.stop(StopRequest())
    assert not b.stop(StopRequest(reason="again"))
    assert b.s.stopping is not None and b.s.stopping.reason == "stopped by request"
    assert b.stop(StopRequest(now=True))
    assert b.s.stopping.now and b.stop_due()
    assert not b.stop(StopRequest())


def test_a_stop_never_ends_a_run_past_its_last_step() -> None:
    b = book(steps=1, batch_size=2, group_size=2, alpha=0)
    groups = admit(b)
    for wid in groups[0]:
        b.report(report(wid))
    train(b)
    b.stop(StopRequest())
    assert b.s.stopping is not None and b.s.stopping.at_version == 1


def test_a_direct_run_past_its_limit_is_refused_and_an_unset_one_is_sharded() -> None:
    import pytest

    from trajflow.contracts.capacity import AUTO_GROUPS_PER_SHARD, DIRECT_MAX_IN_FLIGHT, MAX_CHILDREN_IN_FLIGHT
    from trajflow.contracts.training import TrainSettings

    ok = TrainSettings(batch_size=256, group_size=8, alpha=1, groups_per_shard=0)
    assert ok.max_in_flight() == 512 == DIRECT_MAX_IN_FLIGHT and ok.shard_groups() == 0
    for fields in ({"batch_size": 264}, {"batch_size": 256, "redundancy": 1}, {"batch_size": 992}):
        with pytest.raises(ValueError, match="in a direct run .groups_per_shard = 0., over its limit of 512"):
            TrainSettings.model_validate({"group_size": 8, "alpha": 1, "groups_per_shard": 0, **fields})
    # unset: direct while it fits, shards of 64 groups beyond
    assert TrainSettings(batch_size=256, group_size=8, alpha=1).shard_groups() == 0
    wide = TrainSettings(batch_size=65_536, group_size=16, alpha=2)
    assert wide.groups_per_shard is None and wide.shard_groups() == AUTO_GROUPS_PER_SHARD == 64
    assert wide.max_shards_in_flight() <= MAX_CHILDREN_IN_FLIGHT
    # large groups: fewer groups a shard, so that a shard's members stay under Temporal's 2,000 children
    big = TrainSettings(batch_size=4_096, group_size=256, alpha=1)
    assert big.shard_groups() == 7 and 7 * 256 <= MAX_CHILDREN_IN_FLIGHT
    with pytest.raises(ValueError, match="a shard of 8 groups runs up to 2048 trajectories at once"):
        TrainSettings(batch_size=4_096, group_size=256, alpha=1, groups_per_shard=8)
