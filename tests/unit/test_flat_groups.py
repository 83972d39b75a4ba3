"""Dynamic sampling (`[train] filter_flat_groups`, workflows/flat.py) without Temporal: a complete group whose rewards
are all equal is dropped and replaced by a new seed, within `max_flat_groups_per_step` a step, in a direct run's `Book`
and a sharded run's `ShardBook`; counted in the counters and the step record, carried through continue-as-new."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.unit.test_training_bookkeeping import admit, book, report, train
from trajflow.contracts.shards import GroupCounts, GroupReport
from trajflow.contracts.steps import is_flat
from trajflow.contracts.training import TrainingRunConfig, TrainingStart, TrainingState, TrainStepResult
from trajflow.rl.advantages import group_advantages
from trajflow.workflows.bookkeeping import Book
from trajflow.workflows.fanin import ShardBook


@pytest.mark.parametrize(
    "rewards", [[1.0, 1.0], [0.0, 0.0, 0.0], [-0.1, -0.1], [0.5], [0.0, 1e-12], [1.0, 0.0], [0.3, 0.3, 0.30000001]]
)
def test_flat_is_what_gives_zero_advantages(rewards: list[float]) -> None:
    zero = all(a == 0.0 for a in group_advantages(rewards))
    assert is_flat(rewards) == zero
    assert is_flat(rewards) == (len(rewards) < 2 or len(set(rewards)) == 1)  # compared exactly, no tolerance


def complete(b: Book, ids: list[str], rewards: list[float]):
    """Report the group's members completed with `rewards`; the outcome of the last report."""
    outcomes = [b.report(report(wid, reward=r, version=b.s.version)) for wid, r in zip(ids, rewards, strict=False)]
    return outcomes[-1]


def test_a_flat_group_is_dropped_and_a_new_seed_admitted_in_its_place() -> None:
    b = book(steps=2, batch_size=4, group_size=2, alpha=0, filter_flat_groups=True)
    g0, g1 = admit(b)
    out = complete(b, g0, [0.0, 0.0])
    assert (out.flat, out.flat_group) == ("dropped", "g000000")
    assert "g000000" not in b.s.groups and b.s.counters.flat_groups_dropped == 1
    assert b.s.counters.groups_abandoned == 0 and b.s.counters.dropped_stale == 0  # never counted as lost
    [g2] = admit(b)  # the slot it held is free: the next seed, not the dropped one's
    assert b.s.groups["g000002"].seed == 2 and g2[0].startswith("run-g000002")
    complete(b, g1, [1.0, 0.0])
    assert not b.batch_may_be_ready()
    complete(b, g2, [0.0, 0.5])
    step = b.take_batch()
    assert step is not None and {r.group for r in step.refs} == {"g000001", "g000002"}
    record = b.finish_step(step, TrainStepResult(version=1, weights_uri=None), time_s=1.0)
    assert record.flat_groups_dropped == 1 and b.s.flat_dropped_step == 0
    assert b.s.counters.completed == 6 and b.s.counters.consumed == 4  # the flat group's samples: completed, unused


def test_past_the_steps_budget_flat_groups_are_trained_on_until_the_next_step() -> None:
    b = book(steps=3, batch_size=4, group_size=2, alpha=0, filter_flat_groups=True, max_flat_groups_per_step=1)
    g0, g1 = admit(b)
    assert complete(b, g0, [1.0, 1.0]).flat == "dropped"
    assert complete(b, g1, [1.0, 1.0]).flat == "trained"  # the step's one drop is spent
    [g2] = admit(b)
    assert complete(b, g2, [0.0, 0.0]).flat == "trained"
    step = b.take_batch()
    assert step is not None and [r.reward for r in step.refs] == [1.0, 1.0, 0.0, 0.0]
    record = b.finish_step(step, TrainStepResult(version=1, weights_uri=None), time_s=1.0)
    assert record.flat_groups_dropped == 1
    assert (b.s.counters.flat_groups_dropped, b.s.counters.flat_groups_trained) == (1, 2)
    g3, _ = admit(b)
    assert complete(b, g3, [0.0, 0.0]).flat == "dropped"  # a new step: a new budget


def test_an_every_group_flat_run_still_trains_every_step() -> None:
    """A policy that never wins: each step drops at most `max_flat_groups_per_step`, then trains on flat groups."""
    b = book(steps=3, batch_size=4, group_size=2, alpha=1, filter_flat_groups=True, max_flat_groups_per_step=2)
    started = 0
    for _ in range(50):
        if b.s.version >= 3:
            break
        groups = admit(b)
        started += len(groups)
        for ids in groups:
            complete(b, ids, [0.0, 0.0])
        if b.batch_may_be_ready():
            train(b)
    assert b.s.version == 3 and b.s.counters.consumed == 12
    assert [r.flat_groups_dropped for r in b.s.history] == [2, 2, 2]
    assert started == 6 + b.s.counters.flat_groups_dropped + len(b.open_groups())


def test_the_filter_off_trains_flat_groups_and_counts_nothing() -> None:
    b = book(steps=2, batch_size=4, group_size=2, alpha=0)
    g0, g1 = admit(b)
    assert complete(b, g0, [0.0, 0.0]).flat is None
    complete(b, g1, [0.0, 0.0])
    train(b)
    assert b.s.counters.flat_groups_dropped == b.s.counters.flat_groups_trained == 0
    assert b.s.history[-1].flat_groups_dropped == 0


def test_user_started_groups_are_never_dropped() -> None:
    b = book(steps=2, batch_size=2, group_size=2, alpha=0, filter_flat_groups=True)
    for i in range(2):
        r = report(f"mine-{i}", reward=1.0).model_copy(update={"group": "mine"})
        assert b.report(r).flat is None
    assert b.s.groups["mine"].external and b.s.counters.flat_groups_dropped == 0


def test_sync_mode_replaces_a_dropped_flat_group_for_the_same_batch() -> None:
    b = book(steps=2, batch_size=4, group_size=2, alpha=0, sync=True, filter_flat_groups=True)
    g0, g1 = admit(b)
    complete(b, g0, [1.0, 1.0])
    [g2] = admit(b)
    complete(b, g1, [1.0, 0.0])
    complete(b, g2, [0.0, 1.0])
    train(b)
    assert b.s.history[-1].flat_groups_dropped == 1


def shard_book(**train: object) -> ShardBook:
    fields: dict[str, object] = {"steps": 4, "batch_size": 8, "group_size": 2, "alpha": 0, "groups_per_shard": 4}
    fields.update(train)
    return ShardBook(TrainingRunConfig.model_validate(fields), TrainingState(run_id="run"))


def group(b: ShardBook, k: int, flat: bool):
    counts = GroupCounts(completed=2, started=2)
    return b.group_report(GroupReport(shard="s", k=k, ready=True, counts=counts, flat=flat))


def test_a_sharded_run_drops_a_group_its_shard_found_flat_and_starts_a_shard_for_its_replacement() -> None:
    b = shard_book(filter_flat_groups=True)
    start = b.next_shard()
    assert start is not None and len(start.groups) == 4 and b.next_shard() is None
    out = group(b, 0, flat=True)
    assert (out.flat, out.flat_group) == ("dropped", "g000000") and b.s.counters.flat_groups_dropped == 1
    for k in (1, 2, 3):
        assert group(b, k, flat=False).flat is None
    assert b.take_batch() is None and b.ready_count() == 3
    # 3 groups left, a step needs 4, and the budget (1 group) is below a shard of 4: a partial shard, or a stall
    replacement = b.next_shard()
    assert replacement is not None and [(g.k, g.seed) for g in replacement.groups] == [(4, 4)]
    group(b, 4, flat=False)
    step = b.take_batch()
    assert step is not None and step.groups == [(1, 5)]
    record = b.finish_step(step, TrainStepResult(version=1, weights_uri=None), time_s=1.0)
    assert record.flat_groups_dropped == 1 and b.s.flat_dropped_step == 0


def test_a_sharded_run_without_the_filter_ignores_the_flat_mark() -> None:
    b = shard_book()
    b.next_shard()
    assert group(b, 0, flat=True).flat is None and b.ready_count() == 1
    assert b.s.counters.flat_groups_dropped == 0


def test_the_counts_survive_continue_as_new() -> None:
    b = book(steps=3, batch_size=4, group_size=2, alpha=0, filter_flat_groups=True, max_flat_groups_per_step=3)
    g0, _ = admit(b)
    complete(b, g0, [0.0, 0.0])
    start = TrainingStart(run=b.cfg, resume=b.s)
    again = TrainingStart.model_validate_json(start.model_dump_json())
    assert again.resume is not None and again.run.filter_flat_groups and again.run.max_flat_groups_per_step == 3
    assert again.resume.flat_dropped_step == 1 and again.resume.counters.flat_groups_dropped == 1


def test_config_needs_groups_of_two_and_keeps_the_replacements_seeds_off_the_eval_seeds() -> None:
    with pytest.raises(ValidationError, match="group_size >= 2"):
        TrainingRunConfig(group_size=1, batch_size=4, filter_flat_groups=True)
    # 4 steps of 2 groups, alpha 1, 4 restarts: 60 seeds; 4 steps x 16 flat groups' replacements: 64 more
    fields = {"steps": 4, "batch_size": 8, "group_size": 4, "eval": {"first_seed": 100}}
    assert TrainingRunConfig.model_validate(fields).eval.first_seed == 100
    with pytest.raises(ValidationError, match="held-out seeds"):
        TrainingRunConfig.model_validate({**fields, "filter_flat_groups": True})


def test_the_summary_and_the_live_line_count_the_flat_groups_dropped() -> None:
    from trajflow.cli.commands.train import progress_line, summarise
    from trajflow.contracts.training import StepRecord, TrainingCounters, TrainingProgress, TrainingResult

    history = [
        StepRecord(step=v, time_s=v, reward_mean=0.5, trajectories=4, stale_dropped_total=0, flat_groups_dropped=d)
        for v, d in ((1, 3), (2, 0))
    ]
    counters = TrainingCounters(completed=14, consumed=8, flat_groups_dropped=3)
    result = TrainingResult(run_id="r", version=2, counters=counters, history=history, wall_seconds=3.0)
    summary = summarise(TrainingRunConfig(filter_flat_groups=True), "r", result, 3.0, None, None)
    assert summary.flat_groups_dropped == 3 and summary.flat_groups_dropped_by_step == [3, 0]
    assert summary.counters.groups_abandoned == 0 and summary.trajectories_dropped_stale == 0
    p = TrainingProgress(run_id="r", version=2, steps=4, alpha=1, running=0, buffered=0, counters=counters,
                         last=history[-1], elapsed_s=3.0, tasks=["default"])  # fmt: skip
    assert "flat-dropped 3" in progress_line(p, 0.0)
    quiet = p.model_copy(update={"counters": TrainingCounters(consumed=8)})
    assert "flat" not in progress_line(quiet, 0.0)
