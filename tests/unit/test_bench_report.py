"""trajflow.lab.bench.pipeline's summary (the --json contract) and the printed report, from made-up run figures:
the required keys are there with the right types and the report states the workload beside the figures."""

from __future__ import annotations

import json

import pytest

from trajflow.lab.bench.pipeline import RunFigures
from trajflow.lab.bench.pipeline_report import render, summarize
from trajflow.lab.bench.workload import quick_workload


def _run(label: str, alpha: int, tps: float) -> RunFigures:
    return RunFigures(
        label=label,
        alpha=alpha,
        tps=tps,
        whole_tps=tps * 0.8,
        step_times_s=[1.0, 2.0],
        wall_s=2.5,
        staleness_mean=alpha / 2,
        dropped_stale=0,
        max_in_flight=16,
        decode_utilisation=0.25,
        generation_phases_s=[0.8, 0.8] if alpha == 0 else [],
        admission_s=[0.1, 0.1] if alpha == 0 else [],
        counters={"consumed": 32},
    )


def test_summary_has_the_issue_keys_and_the_report_states_the_workload() -> None:
    w = quick_workload(unit_s=0.01)
    runs = {"sync": _run("sync", 0, 2.0), "alpha1": _run("alpha1", 1, 5.0), "alpha2": _run("alpha2", 2, 6.0)}
    tvb = {
        "1": {
            "sigma": 1.0,
            "traj_tps": 4.0,
            "batch_tps": 3.0,
            "ratio": 1.33,
            "traj_s": [4.0],
            "batch_s": [5.3],
            "batch_rounds": [8],
            "decode_utilisation": {"traj": 0.3, "batch": 0.2},
        },
        "10": {
            "sigma": 10.0,
            "traj_tps": 3.0,
            "batch_tps": 1.5,
            "ratio": 2.0,
            "traj_s": [5.3],
            "batch_s": [10.6],
            "batch_rounds": [8],
            "decode_utilisation": {"traj": 0.3, "batch": 0.2},
        },
    }
    calibration = {"trajectories": 16.0, "wall_s": 4.0, "ceiling_tps": 4.0, "activities_per_s": 52.0, "mean_turns": 4.5}
    machine = {"cpus": 2, "loadavg_1m_start": 1.0, "loadavg_1m_end": 1.5, "bench_process_cpu_s": 10.0}
    s = summarize(w, calibration, _run("pilot", 0, 2.0), 0.8, 0.24, runs, tvb, machine, 42.0)
    s = json.loads(json.dumps(s))  # what --json writes
    assert isinstance(s["sync_tps"], float) and s["sync_tps"] == 2.0
    assert s["async_tps"] == {"1": 5.0, "2": 6.0}
    assert s["speedup"] == {"1": pytest.approx(2.5), "2": pytest.approx(3.0)}
    assert s["ideal_tps"] > 0 and s["efficiency"] == pytest.approx(6.0 / s["ideal_tps"])
    assert set(s["traj_vs_batch"]) == {"1", "10"} and s["workload"]["batch_size"] == 8
    text = render(s)
    assert "SYNTHETIC" in text and "B=8" in text and "1 unit = 0.01 s" in text
    assert "3.00x" in text and "ideal" in text and "2.00x" in text
