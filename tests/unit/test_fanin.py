"""The sharded run's training-side rules (workflows/fanin.py), pure: shards admitted whole, group reports, batches of
group ranges, stale dropping, shards that close without reporting, the admission pause on group reports."""

from __future__ import annotations

import pytest

from trajflow.contracts.shards import BatchStats, GroupCounts, GroupReport, ShardDone, shard_id
from trajflow.contracts.steps import TaskStats
from trajflow.contracts.training import StopRequest, TrainingRunConfig, TrainingState, TrainStepResult
from trajflow.workflows.fanin import ShardBook


def book(**train: object) -> ShardBook:
    fields: dict[str, object] = {"steps": 4, "batch_size": 16, "group_size": 4, "alpha": 1, "groups_per_shard": 2}
    fields.update(train)
    return ShardBook(TrainingRunConfig.model_validate(fields), TrainingState(run_id="run"))


def ready(b: ShardBook, k: int, version: int = 0, completed: int = 4) -> None:
    outcome = b.group_report(
        GroupReport(shard="s", k=k, ready=True, oldest_version=version, counts=GroupCounts(completed=completed))
    )
    assert outcome.counted


def test_admission_starts_whole_shards_within_the_budget() -> None:
    b = book()  # (alpha + 1) * B / n = 8 groups in flight, shards of 2
    starts = [b.next_shard() for _ in range(5)]
    assert [[g.k for g in s.groups] for s in starts[:4] if s] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert starts[4] is None and not b.has_work()
    assert b.live_shards() == [shard_id("run", k) for k in (0, 2, 4, 6)]
    assert [g.seed for g in starts[1].groups] == [2, 3] and starts[1].run_id == "run"  # type: ignore[union-attr]


def test_a_budget_smaller_than_a_shard_waits_for_the_next_step() -> None:
    b = book(groups_per_shard=3)
    sizes = [len(s.groups) for s in iter(b.next_shard, None)]
    assert sizes == [3, 3]  # 2 groups of budget left: less than a shard, and the run is far from its end
    assert b.groups_to_admit() == 2 and b.shard_due() == 0


def test_the_end_of_the_run_admits_a_partial_shard() -> None:
    b = book(steps=1, batch_size=8, alpha=0, groups_per_shard=3)  # 2 groups in all
    start = b.next_shard()
    assert start is not None and [g.k for g in start.groups] == [0, 1]


def test_a_batch_is_the_lowest_ready_groups_as_ranges() -> None:
    b = book()
    for _ in range(4):
        b.next_shard()
    for k in (5, 0, 1):
        ready(b, k)
    assert not b.batch_may_be_ready() and b.take_batch() is None  # 3 groups ready, B/n = 4
    ready(b, 3, version=1)
    ready(b, 2, version=1)
    assert b.batch_may_be_ready()
    step = b.take_batch()
    assert step is not None and step.groups == [(0, 4)] and step.refs == []
    assert b.s.counters.consumed == 16 and b.s.counters.completed == 20
    assert {v: list(ks) for v, ks in b.sh.ready.items()} == {0: [5]}
    assert b.s.step is step


def test_stale_groups_are_dropped_by_their_oldest_version() -> None:
    b = book(alpha=1)
    for _ in range(4):
        b.next_shard()
    ready(b, 0, version=0)
    ready(b, 1, version=2)
    b.s.version = 2
    assert b.drop_stale() == ["g000000"]
    assert b.s.counters.dropped_stale == 4 and list(b.sh.ready) == [2]


def test_a_shard_that_closes_without_reporting_writes_off_its_open_groups() -> None:
    b = book()
    start = b.next_shard()
    assert start is not None
    ready(b, 0)
    wid = shard_id("run", 0)
    assert b.shard_closed(wid) == [1]
    assert b.s.counters.groups_abandoned == 1 and wid not in b.live_shards()
    late = b.group_report(GroupReport(shard=wid, k=1, ready=True))
    assert not late.counted and b.s.counters.late == 1
    assert b.shard_closed(wid) == []  # closing twice changes nothing


def test_shard_done_adds_its_late_counts_and_closes_it() -> None:
    b = book()
    b.next_shard()
    ready(b, 0)
    ready(b, 1)
    b.shard_done(ShardDone(shard=shard_id("run", 0), first=0, counts=GroupCounts(late=2, cancelled=3)))
    assert (b.s.counters.late, b.s.counters.cancelled) == (2, 3) and not b.live_shards()


def test_infra_failed_groups_pause_admission_and_a_completed_group_resumes_it() -> None:
    b = book(pause_after_infra_failures=8)
    for _ in range(4):
        b.next_shard()
    failed = GroupReport(shard="s", k=0, ready=False, counts=GroupCounts(infra_failed=5), last_error="engine gone")
    assert not b.group_report(failed).paused
    outcome = b.group_report(failed.model_copy(update={"k": 1}))
    assert outcome.paused and "engine gone" in (b.s.paused or "")
    assert b.s.counters.groups_abandoned == 2 and b.groups_to_admit() == 0
    b.s.probe = True
    assert b.shard_due() == 1  # a paused run's probe is one group
    ready(b, 2)
    assert b.s.paused is None


def test_finish_step_records_the_trainers_batch_figures() -> None:
    b = book(tasks=[{"name": "a"}, {"name": "b", "weight": 1.0}])
    for _ in range(4):
        b.next_shard()
    for k in range(4):
        ready(b, k)
    step = b.take_batch()
    assert step is not None
    batch = BatchStats(
        trajectories=16,
        reward_mean=0.25,
        wins=4,
        staleness={0: 16},
        by_task={"a": TaskStats(trajectories=8, reward_mean=0.5, wins=4), "b": TaskStats(trajectories=8)},
    )
    record = b.finish_step(step, TrainStepResult(version=1, weights_uri=None, batch=batch), time_s=3.0)
    assert (record.step, record.trajectories, record.reward_mean, record.wins) == (1, 16, 0.25, 4)
    assert record.staleness == {0: 16} and set(record.by_task) == {"a", "b"}
    assert b.s.version == 1 and b.s.step is None and b.s.by_task["a"].wins == 4


def test_stop_now_queues_every_live_shard_for_cancellation() -> None:
    b = book()
    for _ in range(4):
        b.next_shard()
    assert b.stop(StopRequest(now=True))
    assert b.to_cancel == b.live_shards() and b.stop_due()
    assert b.next_shard() is None


@pytest.mark.parametrize("sync", [True, False])
def test_sync_waits_for_every_open_group(sync: bool) -> None:
    b = book(alpha=0, sync=sync, groups_per_shard=4)
    start = b.next_shard()
    assert start is not None and len(start.groups) == 4 and b.next_shard() is None
    for k in range(3):
        ready(b, k)
    assert not b.batch_may_be_ready()
    ready(b, 3)
    assert b.batch_may_be_ready()
