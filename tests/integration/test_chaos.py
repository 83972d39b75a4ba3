"""`trajflow chaos --quick` as a user runs it, on its own embedded stack (own state dir and ports, because it
kills and restarts that stack's processes, the Temporal server included): every fault of the scenario is
injected, and the run's own records say nothing was lost, nothing consumed twice, no infra failure scored and
every step done. The audit's ability to catch each violation is tested in tests/unit/test_chaos_audit.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port, stack_state_dir

pytestmark = pytest.mark.integration


@pytest.fixture()
def chaos_env(cache_dir: Path):
    state_dir = stack_state_dir(cache_dir, "tf-chaos-")
    env = {
        **os.environ,
        "TRAJFLOW_STATE_DIR": str(state_dir),
        "TRAJFLOW_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",
        "TRAJFLOW_TEMPORAL_UI_PORT": str(free_port()),
        "TRAJFLOW_REWARD_PORT": str(free_port()),
        "TRAJFLOW_PROMETHEUS_PORT": str(free_port()),  # the workers' metrics ports survive their restarts
    }
    trajflow = str(Path(sys.executable).parent / "trajflow")
    try:
        yield env, state_dir, trajflow
    finally:
        subprocess.run([trajflow, "down"], cwd=ROOT, env=env, capture_output=True, timeout=120)


def test_quick_chaos_run_loses_nothing(chaos_env) -> None:
    env, state_dir, trajflow = chaos_env
    out = state_dir / "chaos.json"
    proc = subprocess.run(
        [
            trajflow,
            "chaos",
            "--quick",
            "-c",
            "trajflow/configs/tiny.toml",
            "--json",
            str(out),
            "--container-kill-rate",
            "0.2",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.exists(), f"no report:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    report = json.loads(out.read_text())
    shown = f"{proc.stdout}\n{proc.stderr[-3000:]}"
    assert [f["fault"] for f in report["faults"]] == [
        "decode",
        "env",
        "reward",
        "orchestrator",
        "temporal",
        "trainer",
    ], shown
    assert report["faults_not_injected"] == []
    assert all(f["recovered_after_s"] is not None for f in report["faults"]), shown
    trainer = report["faults"][5]
    assert trainer["step_attempt"] >= 2, f"the trainer must die mid-step: {trainer}"
    assert report["containers"]["killed"] >= 1, shown
    assert report["lost"] == 0 and report["consumed_twice"] == 0 and report["infra_failures_scored"] == 0, shown
    assert report["steps_completed"] == report["steps_configured"] == 10, shown
    assert report["consumed"] == 10 * 8
    assert report["started"] == report["completed"] + report["failed"] + report["infra_failed"] + report["cancelled"]
    assert proc.returncode == 0 and "PASS" in proc.stdout, shown
    assert (state_dir / "runs" / report["run_id"] / "chaos.png").exists()
