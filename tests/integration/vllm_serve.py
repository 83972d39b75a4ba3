"""`vllm serve` (from the project's vLLM venv) serving the tiny random model, for the tests that call a real
OpenAI-compatible server (`test_openai_engine.py`, `test_judge_vllm.py`): the server's address and key, and the vLLM
venv's Python. The server itself is the `vllm_server` fixture of tests/integration/conftest.py."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

API_KEY = "trajflow-test-key"
SERVER_START_S = 600


@dataclass
class Server:
    base_url: str
    model_path: Path
    start_s: float
    """Seconds from launching the server to its first answer."""


def vllm_python() -> Path:
    """The vLLM venv's Python, or a skip (a failure under TRAJFLOW_REQUIRE_VLLM=1)."""
    from trajflow.infra.settings import Settings

    python = Settings().resolved_vllm_python
    if python.exists():
        return python
    why = f"{python} does not exist: build the vLLM venv with `make vllm-venv`"
    if os.environ.get("TRAJFLOW_REQUIRE_VLLM") == "1":
        pytest.fail(f"TRAJFLOW_REQUIRE_VLLM=1 but {why}")
    pytest.skip(why)
