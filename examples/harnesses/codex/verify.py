"""The verifier of the Codex task (`env_kwargs.verifier = "verify:checks_pass"`): run after `codex exec` exits with
status 0, in its work directory, where `repo/` is the copy Codex edited. Reward 1.0 when `python3 check_inventory.py`
exits 0 within 30 s, else 0.0; the info has the checks' verdict and Codex's last message (`-o` wrote it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any


def checks_pass(task: Any, seed: int, result: dict[str, Any]) -> dict[str, Any]:
    last = Path(".codex/last-message.txt")
    said = last.read_text()[-300:] if last.is_file() else None
    command = [sys.executable, "check_inventory.py"]
    try:
        proc = subprocess.run(command, cwd="repo", capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"reward": 0.0, "info": {"checks": "timed out", "codex_said": said}}
    verdict = "pass" if proc.returncode == 0 else "fail"
    return {"reward": 1.0 if verdict == "pass" else 0.0, "info": {"checks": verdict, "codex_said": said}}
