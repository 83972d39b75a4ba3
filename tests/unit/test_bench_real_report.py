"""The arithmetic of `trajflow bench real`: busy time as a union of spans, G and T of the sync run, the reference
ratio and the achieved speedups."""

from __future__ import annotations

import pytest

from trajflow.lab.bench.real_report import mode_figures, render, summary, sync_phases, trainer_split, union_seconds


def test_union_counts_overlaps_once_and_clips_to_the_window() -> None:
    assert union_seconds([(0, 2), (1, 3), (5, 6)], (1, 5.5)) == pytest.approx(2.5)
    assert union_seconds([], (0, 10)) == 0.0
    assert union_seconds([(0, 10), (2, 3)], (1, 4)) == pytest.approx(3.0)
    assert union_seconds([(4, 5)], (0, 3)) == 0.0


def test_sync_phases_leave_out_the_first_step() -> None:
    # Step 1 ends at 30 (slow: models load); then each step generates 10 s and trains 5 s.
    g, t = sync_phases([30.0, 45.0, 60.0], [20.0, 5.0, 5.0])
    assert (g, t) == (pytest.approx(10.0), pytest.approx(5.0))
    with pytest.raises(ValueError, match="two steps"):
        sync_phases([30.0], [5.0])


def test_summary_reports_speedup_against_the_reference_ratio() -> None:
    # sync: G = 10, T = 5 -> 15 s a step; perfect overlap would give 10 s a step, a ratio of 1.5.
    decode = [(100.0 + 15 * k, 110.0 + 15 * k) for k in range(4)]
    sync = mode_figures("sync", 0, [15.0, 30.0, 45.0], [5.0, 5.0, 5.0], 8, {"decode": decode}, 100.0, 50.0)
    fast = mode_figures("alpha1", 1, [15.0, 26.0, 37.0], [5.0, 5.0, 5.0], 8, {"decode": [(0.0, 1000.0)]}, 0.0, 40.0)
    s = summary(sync, [fast], {"cpu": "test"})
    assert s["sync_tps"] == pytest.approx(8 * 2 / 30)
    assert s["ideal_speedup"] == pytest.approx(1.5)
    assert s["speedup"] == {"1": pytest.approx(30 / 22)}
    assert s["of_ideal"]["1"] == pytest.approx((30 / 22) / 1.5)  # type: ignore[index]
    assert sync.busy["decode"] == pytest.approx(20 / 30)  # two 10 s decode phases inside [115, 145]
    assert fast.busy["decode"] == pytest.approx(1.0)
    text = render(s)
    assert "reference ratio" in text and "alpha 1" in text
    assert "sandboxes" not in text  # none counted: no line
    fast.sandboxes_started, fast.counters = 5, {"started": 40}
    s = summary(sync, [fast], {"cpu": "test"})
    assert s["sandboxes_started"] == {"sync": None, "alpha1": 5}
    assert "sandboxes alpha1   5 containers started for 40 trajectories" in render(s)


def test_trainer_split_leaves_out_the_first_step_names_the_rest_writing_and_gives_the_updates_speed() -> None:
    parts = [
        {"compute_s": 30.0, "load_s": 1.0, "tokens": 900.0},
        {"compute_s": 4.0, "load_s": 0.5, "tokens": 40.0},
        {"compute_s": 6.0, "load_s": 0.5, "tokens": 60.0},
    ]
    mode = mode_figures(
        "alpha1", 1, [40.0, 50.0, 60.0], [35.0, 6.0, 8.0], 8, {}, 0.0, 60.0, None, parts, {"x": 1.0}, {"trainer": 0.14}
    )
    assert trainer_split(mode) == {
        "train_s": pytest.approx(7.0),
        "compute_s": pytest.approx(5.0),
        "load_s": pytest.approx(0.5),
        "write_s": pytest.approx(1.5),
        "tokens_per_s": pytest.approx(10.0),  # 100 tokens in 10 s of updates, step 1 left out
    }
    assert trainer_split(mode_figures("sync", 0, [1.0, 2.0], [1.0, 1.0], 8, {}, 0.0, 2.0)) == {}
    s = summary(mode, [mode], {"cpu": "test"})
    assert s["trainer_split"]["alpha1"]["write_s"] == pytest.approx(1.5)  # type: ignore[index]
    text = render(s)
    assert "checkpoint and weights 1.5 s; updates at 10 loss tokens/s" in text and "cores alpha1" in text
    assert "waiting for a CPU alpha1   trainer 0.14" in text
