"""The training workflow's state, its continue-as-new input and its query results stay under 512 KiB (issue 25 item
1, docs/capacity.md): measured on the state the workflow's own rules build at steady state, a direct run's
(`trajflow.workflows.bookkeeping.Book`, trajflow.lab.bench.state_size) up to `capacity.DIRECT_MAX_IN_FLIGHT`
trajectories in flight and a sharded run's (`trajflow.workflows.fanin.ShardBook`, trajflow.lab.bench.sharded_state) at B
= 65,536. Step records keep a staleness histogram, not a lag per sample, and read the old list form still (recorded
histories, running workflows' continue-as-new inputs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trajflow.contracts.capacity import DIRECT_MAX_IN_FLIGHT
from trajflow.contracts.training import StepRecord, TrainingStart
from trajflow.lab.bench import sharded_state
from trajflow.lab.bench.state_size import LIMIT, StateSize, config, history, main, sizes, table

TEMPORAL_PAYLOAD_LIMIT = 2 * 1024 * 1024
"""Temporal refuses a payload (an input, a query result) over 2 MB."""
PROGRESS_MAX = 32 * 1024
"""The progress query: 16 step records and counters, whatever B."""


@pytest.fixture(scope="module")
def direct_at_the_limit() -> list[StateSize]:
    """The largest direct configs accepted: in groups of 8 at α = 1, B = 256 (512 trajectories in flight) and with 8
    redundant samples a group B = 128 (512); in groups of 16 at α = 2, B = 160 (480: B = 176 would be 528)."""
    cfgs = [config(256, 8, 1), config(128, 8, 1, redundancy=8), config(160, 16, 2)]
    assert all(c.shard_groups() == 0 for c in cfgs)
    assert all(DIRECT_MAX_IN_FLIGHT - 3 * 16 < c.max_in_flight() <= DIRECT_MAX_IN_FLIGHT for c in cfgs)
    rows = [row for c in cfgs for row in sizes(c)]
    print("\n" + table(rows))  # the figures of docs/capacity.md (pytest -s shows them)
    return rows


@pytest.fixture(scope="module")
def sharded_at_65536() -> list[StateSize]:
    """B = 65,536 in groups of 16 at α = 2 in shards of 64: 196,608 trajectories and 12,288 groups in flight."""
    cfg = config(65_536, 16, 2, groups_per_shard=64)
    assert cfg.max_in_flight() == 196_608 and cfg.max_groups_in_flight() == 12_288
    rows = sharded_state.sizes(cfg)
    print("\n" + table(rows))  # the figures of docs/capacity.md (pytest -s shows them)
    return rows


def test_the_largest_direct_configs_accepted_stay_under_512_kib(direct_at_the_limit: list[StateSize]) -> None:
    assert len(direct_at_the_limit) == 6
    for row in direct_at_the_limit:
        assert row.history == 200 and row.open_groups > 0 and row.groups_per_shard == 0
        assert row.largest < LIMIT, row
        assert row.progress < PROGRESS_MAX, row


def test_a_direct_run_past_its_limit_is_refused_naming_groups_per_shard_and_sharded_when_unset() -> None:
    with pytest.raises(ValueError, match=r"over its limit of 512.*groups_per_shard"):
        config(264, 8, 1)  # 528 trajectories in flight, direct
    with pytest.raises(ValueError, match="groups_per_shard"):
        config(136, 8, 1, redundancy=8)  # 544
    auto = config(264, 8, 1, groups_per_shard=None)
    assert auto.groups_per_shard is None and auto.shard_groups() == 64
    assert config(256, 8, 1, groups_per_shard=None).shard_groups() == 0  # at the limit: still direct


def test_at_b_65536_in_shards_of_64_every_payload_stays_under_512_kib(sharded_at_65536: list[StateSize]) -> None:
    rows = sharded_at_65536
    assert [(r.layout, r.training) for r in rows] == [(lay, t) for lay in ("typical", "worst") for t in (False, True)]
    for row in rows:
        assert row.batch_size == 65_536 and row.groups_per_shard == 64 and row.history == 200
        assert row.continue_as_new < LIMIT and row.state < LIMIT and row.progress < LIMIT, row
        assert row.continue_as_new > row.state > row.progress
    worst = {r.training: r for r in rows if r.layout == "worst"}
    # the worst layout leaves every group in flight a range of its own: (α + 1)·B/n with a step in flight
    assert worst[True].ranges >= 12_288 and worst[True].open_groups == 8_192
    assert worst[False].open_groups == 12_288
    typical = {r.training: r for r in rows if r.layout == "typical"}
    assert all(typical[t].ranges < worst[t].ranges and typical[t].largest < worst[t].largest for t in (False, True))


def test_the_progress_query_does_not_grow_with_b(sharded_at_65536: list[StateSize]) -> None:
    small = sharded_state.sizes(config(256, 16, 2, groups_per_shard=4), layouts=("worst",))
    for row in sharded_at_65536:
        assert row.progress < PROGRESS_MAX
        # the same records and counters: only their digits differ
        assert all(abs(row.progress - s.progress) < 1024 for s in small), (row, small)


def test_the_worst_layout_fragments_every_group_in_flight() -> None:
    cfg = config(64, 4, 1, groups_per_shard=4)  # 32 groups in flight, shards of 4
    past = sharded_state.history(cfg)
    step = sharded_state.steady_state(cfg, past, "worst", training=True)
    sh = step.sharded
    assert sh is not None and step.step is not None
    assert all(end - start == 1 for start, end in step.step.groups) and len(step.step.groups) == 16
    held = [*sh.open.ranges, *(r for v in sh.ready.values() for r in v.ranges)]
    assert len(held) == len(sh.open) + sum(len(v) for v in sh.ready.values()) == 16
    assert len(sh.ready) > 1  # oldest versions differ: one set per version
    waiting = sharded_state.steady_state(cfg, past, "worst", training=False)
    assert waiting.step is None and waiting.sharded is not None
    assert sum(len(v) for v in waiting.sharded.ready.values()) == 64 // 4 - 1  # one short of a batch


def test_a_step_record_keeps_a_histogram_of_its_samples_staleness() -> None:
    past = history(config(16, 4, 1))  # small: the rules, not the size
    assert len(past.history) == 200
    assert all(sum(r.staleness.values()) == r.trajectories == 16 for r in past.history)
    assert past.history[-1].staleness == {0: 8, 1: 8}  # one of every α + 1 members reported a version behind


def test_a_sharded_step_record_is_made_of_the_trainers_batch_figures() -> None:
    s, _ = sharded_state.history(config(64, 4, 1, groups_per_shard=4))
    assert len(s.history) == 200 and s.version == 200
    assert all(r.trajectories == 64 and sum(r.staleness.values()) == 64 for r in s.history)
    assert all(set(r.by_task) == {"countdown", "gsm8k-math"} for r in s.history)
    assert s.counters.consumed == 200 * 64 and s.sharded is not None and not s.sharded.ready


def test_an_old_step_record_lists_every_lag_and_is_read_as_its_histogram() -> None:
    old = {"step": 3, "time_s": 1.0, "reward_mean": 0.5, "trajectories": 5, "stale_dropped_total": 0,
           "staleness": [1, 0, 1, 1, 0]}  # fmt: skip
    assert StepRecord.model_validate(old).staleness == {0: 2, 1: 3}
    # as a continue-as-new input from a worker older than the histogram carries it, and back through JSON
    start = TrainingStart.model_validate({"resume": {"run_id": "r", "version": 3, "history": [old]}})
    assert start.resume is not None and start.resume.history[0].staleness == {0: 2, 1: 3}
    again = TrainingStart.model_validate_json(start.model_dump_json())
    assert again.resume is not None and again.resume.history[0].staleness == {0: 2, 1: 3}
    with pytest.raises(ValueError, match="staleness"):
        StepRecord.model_validate({**old, "staleness": "1,0"})


def test_the_bench_prints_its_table_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--batch", "16", "--group", "4", "--json", str(tmp_path / "sizes.json")])
    out = capsys.readouterr().out
    assert out.startswith("| B | n | α | r | mode |") and out.count("\n| 16 | 4 | 1 | 0 | direct |") == 2
    rows = json.loads((tmp_path / "sizes.json").read_text())
    assert [r["training"] for r in rows] == [False, True] and all(0 < r["progress"] < r["state"] for r in rows)


def test_the_bench_measures_a_sharded_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--batch", "64", "--group", "4", "--groups-per-shard", "4", "--json", str(tmp_path / "sizes.json")])
    out = capsys.readouterr().out
    assert out.count("| 64 | 4 | 1 | 0 | shards of 4, typical |") == 2
    assert out.count("| 64 | 4 | 1 | 0 | shards of 4, worst |") == 2
    rows = json.loads((tmp_path / "sizes.json").read_text())
    assert [(r["layout"], r["training"]) for r in rows] == [
        ("typical", False), ("typical", True), ("worst", False), ("worst", True)
    ]  # fmt: skip
    assert all(r["groups_per_shard"] == 4 and r["ranges"] > 0 and r["shards"] > 0 for r in rows)


def test_the_bench_refuses_a_batch_that_is_no_multiple_of_the_group(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--batch", "10", "--group", "4"])
    assert "batch_size (10) must be a multiple of group_size (4)" in capsys.readouterr().err


def test_the_bench_refuses_a_sharded_config_the_check_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--batch", "64", "--group", "4", "--groups-per-shard", "1000"])  # 1,000 x 4 trajectories in a shard
    assert "Lower groups_per_shard" in capsys.readouterr().err
