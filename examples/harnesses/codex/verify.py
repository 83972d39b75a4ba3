"""The verifier of the Codex task (`env_kwargs.verifier = "verify:checks_pass"`): run after `codex exec` exits with
status 0, in its work directory, where `repo/` is the copy Codex edited. Reward 1.0 when `python3 check_inventory.py`
exits 0 within 30 s, else 0.0; the info has the checks' verdict, Codex's last message (`-o` wrote it) and how its turn
ended (the last `turn.*` event of its `--json` stream: `turn.completed` or `turn.failed`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def checks_pass(task: Any, seed: int, result: dict[str, Any]) -> dict[str, Any]:
    last = Path(".codex/last-message.txt")
    said = last.read_text()[-300:] if last.is_file() else None
    stream = Path(".codex/events.jsonl")
    events = (
        [json.loads(line) for line in stream.read_text().splitlines() if line.startswith("{")]
        if stream.is_file()
        else []
    )
    ended = next((e["type"] for e in reversed(events) if str(e.get("type", "")).startswith("turn.")), None)
    command = [sys.executable, "check_inventory.py"]
    try:
        proc = subprocess.run(command, cwd="repo", capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"reward": 0.0, "info": {"checks": "timed out", "codex_said": said, "codex_turn": ended}}
    verdict = "pass" if proc.returncode == 0 else "fail"
    info = {"checks": verdict, "codex_said": said, "codex_turn": ended}
    return {"reward": 1.0 if verdict == "pass" else 0.0, "info": info}
