"""`trajflow bench real` end to end on the embedded stack with the tiny model: it runs sync and an async mode
and writes the figures the issue names. A test of the bench's plumbing, not of any speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trajflow.contracts.config import load_run_config

pytestmark = pytest.mark.integration


def test_bench_real_writes_every_figure(cli_stack, tmp_path: Path) -> None:
    out = tmp_path / "real.json"
    proc = cli_stack.trajflow(
        "bench",
        "real",
        "-c",
        str(cli_stack.config),
        "--steps",
        "3",
        "--batch-size",
        "4",
        "--group-size",
        "2",
        "--alphas",
        "1",
        "--json",
        str(out),
        timeout=900,
    )
    figures = json.loads(out.read_text())
    assert set(figures) >= {"sync_tps", "async_tps", "speedup", "ideal_speedup", "busy", "G_s", "T_s", "machine"}
    assert figures["sync_tps"] > 0 and figures["async_tps"]["1"] > 0
    assert figures["speedup"]["1"] == pytest.approx(figures["async_tps"]["1"] / figures["sync_tps"])
    assert 1.0 <= figures["ideal_speedup"] <= 2.0
    assert figures["G_s"] > 0 and figures["T_s"] > 0
    for mode in ("sync", "alpha1"):
        busy = figures["busy"][mode]
        assert 0.0 < busy["decode"] <= 1.0 and 0.0 < busy["trainer"] <= 1.0
    sync = next(m for m in figures["modes"] if m["label"] == "sync")
    assert len(sync["step_times_s"]) == 3 and sync["counters"]["consumed"] == 12
    assert "reference ratio" in proc.stdout
    assert out.with_suffix(".png").stat().st_size > 10_000  # the timeline plot
    config = load_run_config(cli_stack.config)
    kernels = figures["machine"]["kernels"]  # what decided the kernels: the config's precision, the stack's ISA caps
    assert (
        kernels["decode_dtype"] == config.model.dtype and kernels["trainer_autocast"] == config.train.trainer.autocast
    )
    assert kernels["isa_caps"] == {"decode": {}, "trainer": {}}, kernels  # read from the live processes: none set
