"""trajflow.lab.bench.prefix_cache at its quick size, so `trajflow bench prefix-cache` cannot rot: both options play the same
real GEM episodes, the cache supplies prompt tokens from the second turn on (and the second set's instructions),
the no-cache option none, and the completions are the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trajflow.lab.bench.prefix_cache import main


def test_the_quick_bench_plays_both_options(cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "prefix.json"
    assert main(quick=True, json_path=out, models_dir=cache_dir / "models", episodes=4, threads=1) == 0
    report = json.loads(out.read_text())
    plain, cached = report["options"]
    assert (plain["option"], cached["option"]) == ("no-cache", "prefix-cache")
    assert [t["turn"] for t in plain["turns"]] == [t["turn"] for t in cached["turns"]]
    assert plain["turns"][-1]["turn"] == "new episodes' first" and len(plain["turns"]) >= 3
    assert all(t["reused_tokens"] == 0 for t in plain["turns"])
    assert cached["turns"][0]["reused_tokens"] == 0, "nothing is cached before the first batch"
    assert all(t["reused_tokens"] > t["prompt_tokens"] / 2 for t in cached["turns"][1:])
    assert report["identical_completions"] == report["completions"] > 0
    assert report["diverged"] == [] and report["max_logprob_gap"] <= 1e-4
    assert report["speedup"] > 0 and out.with_suffix(".png").stat().st_size > 0
