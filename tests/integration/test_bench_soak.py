"""`trajflow bench scale --quick` and `trajflow bench soak --quick` end to end, on the real Temporal dev server
and reward service (simulated engine and synthetic env): the figures each level reports, and a training run that
continues as new many times with nothing lost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration
TRAJFLOW = str(Path(sys.executable).parent / "trajflow")


def _quick(bench: str, tmp_path: Path) -> tuple[dict, str]:
    """`trajflow bench BENCH --quick`'s JSON (it must exit 0) and its progress output."""
    out = tmp_path / f"{bench}.json"
    proc = subprocess.run(
        [TRAJFLOW, "bench", bench, "--quick", "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text()), proc.stderr


def test_quick_scale_keeps_each_level_in_flight_and_loses_nothing(tmp_path: Path) -> None:
    s, progress = _quick("scale", tmp_path)
    assert set(s["levels"]) == {"20", "100"}
    for key, level in s["levels"].items():
        n = int(key)
        assert level["lost"] == level["unfinished"] == 0 and level["completed"] == level["started"] >= n, level
        assert level["in_flight"] >= 0.8 * n, level["in_flight_timeline"]
        # measured once the first N have ended, over at least the 15 s asked and at least that warm-up
        assert level["warm_up_s"] >= 6 and level["window_s"] >= max(15, level["warm_up_s"]) - 0.5, level
        assert level["trajectories_per_s"] > 0 and level["activities_per_s"] == pytest.approx(
            level["trajectories_per_s"] * 10, rel=0.01
        )
        o = level["overhead_ms"]
        assert o["samples"] >= 10 and 0 < o["p50"] <= o["p99"], o
        cpu = level["cpu_cores"]
        assert set(cpu) == {"orchestrator", "decode", "env", "reward", "server", "reward_service", "driver"}, cpu
        assert cpu["orchestrator"] > 0 and cpu["server"] > 0 and cpu["decode"] > 0, cpu
        h = level["history"]
        # a 3-turn trajectory: its events grow with its 10 activities, not beyond
        assert h["samples"] >= 5 and 30 <= h["events_mean"] <= 120 and h["bytes_mean"] > 0, h
        assert level["saturated"]
    assert s["machine"]["cores"] >= 1
    assert s["floor"]["activities"] == 100 and s["floor"]["round_trip_ms"] > 0 and s["floor"]["server_cpu_ms"] > 0
    assert "level 100:" in progress and "lost 0" in progress


def test_quick_soak_continues_as_new_many_times_and_loses_nothing(tmp_path: Path) -> None:
    s, progress = _quick("soak", tmp_path)
    assert s["lost"] == [] and s["steps"] == 60
    assert s["continued_as_new"] >= 5, s
    c = s["counters"]
    assert c["consumed"] == 60 * 4 and c["failed"] == c["infra_failed"] == 0
    assert sum(s["trajectories_by_status"].values()) == c["started"]
    assert "nothing lost" in progress
