"""Every file in trajflow/configs/ and every example's config parses; a config that sends a stage to an undeclared pool is
rejected clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from trajflow.contracts.config import RunConfig, load_run_config
from trajflow.contracts.trajectory import TrajectoryRequest

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted([*(ROOT / "trajflow" / "configs").glob("*.toml"), *(ROOT / "examples").glob("*/*.toml")])


def test_there_are_configs() -> None:
    assert len(CONFIGS) >= 3


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_config_parses_and_builds_requests(path: Path) -> None:
    cfg = load_run_config(path)
    for task in cfg.tasks:
        req = task.request(seed=3)
        assert req.env_id == task.env_id and req.seed == 3 and req.pools == task.pools


def test_undeclared_pool_is_rejected_with_its_name(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[tasks]]\nname = "x"\npools = { env = "cpu-big" }\n')
    with pytest.raises(ValueError, match="cpu-big"):
        load_run_config(bad)


def test_unknown_field_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nname = 'oops'\n")
    with pytest.raises(ValueError, match="name"):
        load_run_config(bad)


def test_every_request_field_has_a_default() -> None:
    req = TrajectoryRequest.model_validate({})
    assert req.env_id.startswith("game:") and req.max_turns >= 2
    assert RunConfig().tasks[0].env_id == req.env_id
