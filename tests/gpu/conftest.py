"""What the GPU tests share: SmolLM2-135M's architecture with random weights, built once a session by the GPU check's
own builder (`trajflow.lab.bench.gpu_check.build_random_model`), and the figures the tests measure.

Each test puts its figures under a name in `gpu_figures`; at the end of the session they are printed in the terminal
summary and, when `TRAJFLOW_GPU_REPORT` names a file, merged into that JSON file (so the main venv's run and the vLLM
venv's run of `make test-gpu` fill one file), each section with the machine it ran on. Nothing heavy is imported
before a test asks for it: this file is loaded whenever tests/ is collected.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import pytest

REPORT_ENV = "TRAJFLOW_GPU_REPORT"
FIGURES: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="session")
def smollm2_random(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M's architecture, random weights (seed 0), float32 on disk, with a word-level tokenizer."""
    from trajflow.lab.bench.gpu_check import build_random_model

    return build_random_model(tmp_path_factory.mktemp("gpu-models") / "smollm2-135m-random", quick=False)


@pytest.fixture(scope="session")
def gpu_figures() -> dict[str, dict[str, Any]]:
    """Name -> figures of one test; reported at the end of the session (see the module docstring)."""
    return FIGURES


def _machine() -> dict[str, Any]:
    import torch

    return {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get(REPORT_ENV)
    if not target or not FIGURES:
        return
    path = Path(target)
    report = json.loads(path.read_text()) if path.exists() else {}
    machine = _machine()
    report.update({name: {**figures, "machine": machine} for name, figures in FIGURES.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    terminalreporter.section("GPU figures")
    for name, figures in FIGURES.items():
        terminalreporter.write_line(f"{name}: {figures.get('summary', '')}")
    if os.environ.get(REPORT_ENV):
        terminalreporter.write_line(f"(all figures: {os.environ[REPORT_ENV]})")
