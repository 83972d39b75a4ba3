"""Process settings: defaults for one machine, derived values, TRAJFLOW_* overrides."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trajflow.infra.settings import load_settings


def test_derived_values(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRAJFLOW_STATE_DIR", str(tmp_path))
    s = load_settings()
    assert s.resolved_store_url == (tmp_path / "store").resolve().as_uri()
    assert s.resolved_reward_url == f"http://{s.reward_host}:{s.reward_port}"
    assert s.resolved_vllm_python == Path(sys.prefix).parent / ".vllm-venv" / "bin" / "python"
    assert s.cache_dir == tmp_path / "cache"
    monkeypatch.setenv("TRAJFLOW_STORE_URL", "s3://bucket/prefix")
    monkeypatch.setenv("TRAJFLOW_VLLM_PYTHON", "/opt/v/bin/python")
    s = load_settings()
    assert s.resolved_store_url == "s3://bucket/prefix" and s.resolved_vllm_python == Path("/opt/v/bin/python")
