"""trajflow.lab.bench.workload: the default workload stays what the issue fixed, and the bound and throughput
arithmetic is what the report says it is."""

from __future__ import annotations

import math

import pytest

from trajflow.lab.bench.workload import (
    Workload,
    admission_bound,
    generation_phases,
    group_latency_units,
    ideal_bound,
    quick_workload,
    steady_tps,
    whole_run_tps,
)


def test_the_default_workload_is_the_papers_agentic_setting() -> None:
    w = Workload()
    assert (w.batch_size, w.group_size, w.min_turns, w.max_turns) == (64, 8, 1, 8)
    assert (w.decode_median, w.decode_sigma, w.slots, w.train_fraction) == (1.0, 1.0, 32, 0.3)
    assert w.sigmas == (1.0, 5.0, 10.0) and w.alphas == (1, 2) and w.env_mean == 5.0
    assert w.mean_turns == 4.5 and w.mean_decode == pytest.approx(math.exp(0.5))
    q = quick_workload()
    assert (q.batch_size, q.group_size, q.steps, q.sigmas, q.quick) == (8, 4, 2, (1.0, 10.0), True)
    assert "B=64" in w.describe() and "1 unit = 1 s" in w.describe()


def test_ideal_bound_is_the_smaller_of_decode_capacity_and_the_train_step() -> None:
    w = Workload()
    decode = 32 / (4.5 * math.exp(0.5))  # ≈ 4.31 trajectories per unit
    slow_train = ideal_bound(w, train_units=30.0)
    assert slow_train.decode_capacity == pytest.approx(decode)
    assert slow_train.train_bound == pytest.approx(64 / 30)
    assert slow_train.ideal == pytest.approx(64 / 30) and slow_train.limited_by == "train step"
    fast_train = ideal_bound(w, train_units=5.0)
    assert fast_train.ideal == pytest.approx(decode) and fast_train.limited_by == "decode capacity"


def test_admission_bound_is_littles_law_on_the_budget() -> None:
    w = Workload()
    assert admission_bound(w, 1, train_units=20.0, latency=60.0) == pytest.approx(2 * 64 / 80)
    assert admission_bound(w, 0, train_units=20.0, latency=60.0) == pytest.approx(64 / 80)


def test_group_latency_without_randomness_is_the_expected_longest_episode() -> None:
    w = Workload(decode_sigma=0.0, env_mean=0.0, env_sigma=0.0, group_size=8)
    # every turn takes exactly 1 unit, so a group takes max(turns) units: E[max of 8 uniform 1..8]
    exact = sum(1 - ((k - 1) / 8) ** 8 for k in range(1, 9))
    assert group_latency_units(w, 0.0, samples=4000) == pytest.approx(exact, rel=0.02)
    assert group_latency_units(w, 0.0, members=1, samples=4000) == pytest.approx(4.5, rel=0.03)


def test_throughput_and_phase_arithmetic() -> None:
    times = [10.0, 20.0, 30.0, 40.0]
    assert steady_tps(times, 64) == pytest.approx(64 * 3 / 30)
    assert whole_run_tps(times, 64) == pytest.approx(64 * 4 / 40)
    assert generation_phases([10.0, 22.0], [2.0, 3.0]) == pytest.approx([8.0, 9.0])
    with pytest.raises(ValueError):
        steady_tps([10.0], 64)


def test_inconsistent_workloads_are_refused() -> None:
    with pytest.raises(ValueError):
        Workload(batch_size=60, group_size=8)
    with pytest.raises(ValueError):
        Workload(steps=1)
