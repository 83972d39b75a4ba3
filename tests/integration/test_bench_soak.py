"""`trajflow bench soak --quick` end to end, on the real Temporal dev server and reward service (simulated engine
and synthetic env): a training run that continues as new many times with nothing lost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.own_stack]
TRAJFLOW = str(Path(sys.executable).parent / "trajflow")


def _quick(bench: str, tmp_path: Path) -> tuple[dict, str]:
    """`trajflow bench BENCH --quick`'s JSON (it must exit 0) and its progress output."""
    out = tmp_path / f"{bench}.json"
    proc = subprocess.run(
        [TRAJFLOW, "bench", bench, "--quick", "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text()), proc.stderr


def test_quick_soak_continues_as_new_many_times_and_loses_nothing(tmp_path: Path) -> None:
    s, progress = _quick("soak", tmp_path)
    assert s["lost"] == [] and s["steps"] == 60
    assert s["continued_as_new"] >= 5, s
    c = s["counters"]
    assert c["consumed"] == 60 * 4 and c["failed"] == c["infra_failed"] == 0
    assert sum(s["trajectories_by_status"].values()) == c["started"]
    assert "nothing lost" in progress
