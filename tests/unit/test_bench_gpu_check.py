"""trajflow.lab.bench.gpu_check on the CPU at its quick size, so the GPU check cannot rot: it runs the engine and the
trainer through `trajflow/rl/` without temporalio, docker or boto3 (made unimportable in its process) and reports sane
figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ABSENT = "import sys\nfor m in ('temporalio', 'docker', 'boto3'):\n    sys.modules[m] = None  # as if not installed\n"


def test_the_gpu_check_runs_on_the_cpu_without_the_services(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    code = ABSENT + (
        "from trajflow.lab.bench.gpu_check import main\n"
        f"sys.exit(main(['--quick', '--device', 'cpu', '--json', {str(out)!r}]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"].startswith("cpu") and report["quick"] is True
    assert [row["batch"] for row in report["decode"]["batches"]] == [1, 4]
    assert all(row["tokens"] > 0 and row["tokens_per_s"] > 0 for row in report["decode"]["batches"])
    train = report["train"]
    assert train["device"] == "cpu" and train["median_step_s"] > 0 and train["loss_finite"] is True
    assert train["tokens_per_step"] == sum(160 + 60 * (1 + i % 4) for i in range(4))
    assert "batch   4:" in done.stdout
