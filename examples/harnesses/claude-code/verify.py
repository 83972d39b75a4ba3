"""The verifier of the Claude Code task (`env_kwargs.verifier = "verify:words_fixed"`): run after `claude -p` exits
with status 0, in its work directory, where `repo/` is the copy Claude Code edited. Reward 1.0 when
`python3 check_words.py` exits 0 within 30 s, else 0.0; the info has the verdict and how Claude Code's run ended (the
`result` event of its stream-json output: `success`, `error_max_turns`, ...)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def words_fixed(task: Any, seed: int, result: dict[str, Any]) -> dict[str, Any]:
    stream = Path(".claude/stream.jsonl")
    events = [json.loads(line) for line in stream.read_text().splitlines() if line.strip()] if stream.is_file() else []
    ended = next((e.get("subtype") for e in reversed(events) if e.get("type") == "result"), None)
    command = [sys.executable, "check_words.py"]
    try:
        proc = subprocess.run(command, cwd="repo", capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"reward": 0.0, "info": {"checks": "timed out", "claude_ended": ended}}
    verdict = "pass" if proc.returncode == 0 else "fail"
    return {"reward": 1.0 if verdict == "pass" else 0.0, "info": {"checks": verdict, "claude_ended": ended}}
