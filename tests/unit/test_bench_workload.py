"""trajflow.lab.bench.workload: the default workload stays what the issue fixed, and inconsistent ones are
refused."""

from __future__ import annotations

import math

import pytest

from trajflow.lab.bench.workload import Workload


def test_the_default_workload_is_the_papers_agentic_setting() -> None:
    w = Workload()
    assert (w.batch_size, w.group_size, w.min_turns, w.max_turns) == (64, 8, 1, 8)
    assert (w.decode_median, w.decode_sigma, w.slots, w.train_fraction) == (1.0, 1.0, 32, 0.3)
    assert w.sigmas == (1.0, 5.0, 10.0) and w.alphas == (1, 2) and w.env_mean == 5.0
    assert w.mean_turns == 4.5 and w.mean_decode == pytest.approx(math.exp(0.5))
    assert "B=64" in w.describe() and "1 unit = 1 s" in w.describe()


def test_inconsistent_workloads_are_refused() -> None:
    with pytest.raises(ValueError):
        Workload(batch_size=60, group_size=8)
    with pytest.raises(ValueError):
        Workload(steps=1)
