"""trajflow.lab.bench.batching on the tiny model (`--tiny`), so `trajflow bench batching` cannot rot: both modes play
both workloads, the figures and ratios are there, and seeded sampling gives both modes the same tokens (float32)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trajflow.lab.bench.batching import MODES, RATIOS, long_tail_budgets, main


def test_long_tail_budgets_are_powers_of_two_with_a_tail() -> None:
    budgets = long_tail_budgets(200, 256)
    assert all(8 <= b <= 256 and b & (b - 1) == 0 for b in budgets)
    assert budgets.count(8) > len(budgets) / 3 and max(budgets) == 256 and sum(b >= 64 for b in budgets) >= 10
    assert sorted(long_tail_budgets(16, 128)) == [8] * 9 + [16] * 4 + [32, 64, 128]


def test_the_tiny_bench_plays_both_modes(cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "batching.json"
    assert main(quick=True, json_path=out, models_dir=cache_dir / "models", threads=1, tiny=True, dtype="float32") == 0
    report: dict[str, Any] = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert [w["workload"] for w in report["workloads"]] == ["demo", "long-tail"]
    assert report["machine"]["cpu"] and report["threads"] == 1
    for w in report["workloads"]:
        for mode in MODES:
            figures = w[mode]
            assert figures["requests"] == w["trajectories"] * w["turns"]
            assert figures["completion_tokens"] > 0 and figures["p99_latency_s"] >= figures["p50_latency_s"] > 0
        assert set(w["ratios"]) == set(RATIOS) and all(v is not None and v > 0 for v in w["ratios"].values())
        assert w["identical_trajectories"] == w["trajectories"]  # tiny model: float32, seeded


def test_random_weights_play_token_prompts_with_no_pretrained_model(tmp_path: Path) -> None:
    """`--random-weights` (what a lent GPU machine runs: no pretrained model, no GEM), on the tiny architecture:
    each turn's prompt is the last one, its completion and a fixed user turn."""
    from trajflow.lab.bench.batching import cli

    out = tmp_path / "random.json"
    argv = ["--tiny", "--random-weights", "--dtype", "float32", "--threads", "1", "--json", str(out)]
    assert cli(argv) == 0
    report: dict[str, Any] = json.loads(out.read_text())
    assert report["model"] == "quick: 2 blocks, random (smoke test)"
    assert report["device"] == "cpu" and report["gpu"] is None
    demo = report["workloads"][0]
    assert demo["workload"] == "demo" and demo["turns"] == 2
    for mode in MODES:
        assert demo[mode]["requests"] == demo["trajectories"] * 2 and demo[mode]["completion_tokens"] > 0
    assert demo["identical_trajectories"] == demo["trajectories"]  # float32, seeded: both modes sample alike
