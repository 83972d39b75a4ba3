"""The verifier of the mini-swe-agent task (`env_kwargs.verifier = "verify:tests_pass"`): run after `mini` exits with
status 0, in its work directory, where `repo/` is the copy it edited. Reward 1.0 when the repository's tests pass
(`python3 test_calc.py` exits 0 within 30 s), else 0.0; the info says which, with the end of the test's output."""

from __future__ import annotations

import subprocess
import sys
from typing import Any


def tests_pass(task: Any, seed: int, result: dict[str, Any]) -> dict[str, Any]:
    try:
        command = [sys.executable, "test_calc.py"]
        proc = subprocess.run(command, cwd="repo", capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"reward": 0.0, "info": {"tests": "timed out"}}
    passed = proc.returncode == 0
    tail = (proc.stdout + proc.stderr)[-300:]
    return {"reward": 1.0 if passed else 0.0, "info": {"tests": "pass" if passed else "fail", "output": tail}}
