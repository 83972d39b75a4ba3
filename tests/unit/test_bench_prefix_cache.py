"""trajflow.lab.bench.prefix_cache at its quick size, so `trajflow bench prefix-cache` cannot rot: both options play the
same real GEM episodes, the cache supplies prompt tokens from the second turn on (and the second set's instructions),
the no-cache option none, and, in float32, the completions are the same. In bfloat16 (what "auto" picks on a CPU with
native bf16) reused keys and values round differently from recomputed ones, so completions may part where a sampled
token is near a tie: there the logprobs must agree within bf16's resolution up to where they part."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trajflow.lab.bench.prefix_cache import main

BF16_MAX_LOGPROB_GAP = 5e-2
"""About 13 bf16 rounding steps (2**-8 relative each) of a logprob near 1: 4x the 1.1e-2 seen on an AVX512-BF16 CPU
and, emulated, on an AVX2 one (15 of 20 completions identical on both)."""


def quick_report(tmp_path: Path, models: Path, dtype: str) -> dict[str, Any]:
    out = tmp_path / f"prefix-{dtype}.json"
    assert main(quick=True, json_path=out, models_dir=models, episodes=4, threads=1, dtype=dtype) == 0
    report: dict[str, Any] = json.loads(out.read_text())
    plain, cached = report["options"]
    assert plain["dtype"] == cached["dtype"] == dtype
    assert (plain["option"], cached["option"]) == ("no-cache", "prefix-cache")
    assert [t["turn"] for t in plain["turns"]] == [t["turn"] for t in cached["turns"]]
    assert plain["turns"][-1]["turn"] == "new episodes' first" and len(plain["turns"]) >= 3
    assert all(t["reused_tokens"] == 0 for t in plain["turns"])
    assert cached["turns"][0]["reused_tokens"] == 0, "nothing is cached before the first batch"
    assert all(t["reused_tokens"] > t["prompt_tokens"] / 2 for t in cached["turns"][1:])
    assert report["speedup"] > 0 and out.with_suffix(".png").stat().st_size > 0
    return report


def test_the_quick_bench_plays_both_options(cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """float32 whatever the CPU: exactness is the point (the cache changes no completion)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    report = quick_report(tmp_path, cache_dir / "models", "float32")
    assert report["identical_completions"] == report["completions"] > 0
    assert report["diverged"] == [] and report["max_logprob_gap"] <= 1e-4


def test_the_quick_bench_in_bf16_agrees_within_its_resolution(
    cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bfloat16 whatever the CPU (emulated, slower, on one without native bf16)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    report = quick_report(tmp_path, cache_dir / "models", "bfloat16")
    assert report["completions"] > 0 and report["max_logprob_gap"] <= BF16_MAX_LOGPROB_GAP
    assert all(d["turn"] != 0 for d in report["diverged"]), "the first turn reuses nothing: it must be identical"
