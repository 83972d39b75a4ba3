"""Every file in trajflow/configs/ and every example's config parses; a config that sends a stage to an undeclared pool
is rejected clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from trajflow.contracts.config import RunConfig, load_run_config, resolve_config, shipped_configs
from trajflow.contracts.trajectory import TrajectoryRequest

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(
    [
        *(ROOT / "trajflow" / "configs").glob("*.toml"),
        *(ROOT / "examples").glob("*/*.toml"),
        *(ROOT / "examples").glob("harnesses/*/*.toml"),
    ]
)


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


# --- shipped configs by name ---------------------------------------------------------------------------------------


def test_a_shipped_config_is_found_by_name_with_or_without_its_suffix() -> None:
    shipped = shipped_configs()
    assert {"default", "tiny", "smoke", "hosts"} <= set(shipped)
    assert resolve_config("tiny") == resolve_config("tiny.toml") == shipped["tiny"]
    assert load_run_config("smoke") == load_run_config(shipped["smoke"])


def test_a_file_wins_over_a_shipped_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny").write_text("[train]\nsteps = 7\n")
    assert resolve_config("tiny") == Path("tiny")
    assert load_run_config("tiny").train.steps == 7


def test_an_unknown_name_lists_the_shipped_configs() -> None:
    with pytest.raises(ValueError, match=r"config file not found: nope .*shipped: default, .*tiny"):
        resolve_config("nope")
    with pytest.raises(ValueError, match="config file not found: sub/tiny.toml"):
        resolve_config("sub/tiny.toml")  # a path is never read as a name


def test_the_cli_lists_and_shows_the_shipped_configs() -> None:
    import json

    from typer.testing import CliRunner

    from trajflow.cli import app

    listed = CliRunner().invoke(app, ["configs", "list", "--json"])
    assert listed.exit_code == 0
    rows = {r["name"]: r for r in json.loads(listed.output)}
    assert set(rows) == set(shipped_configs())
    assert rows["tiny"]["model"] == "tiny" and rows["tiny"]["tasks"] == ["game:GuessTheNumber-v0-easy"]
    shown = CliRunner().invoke(app, ["configs", "show", "tiny"])
    assert shown.exit_code == 0 and shown.output == shipped_configs()["tiny"].read_text()
    unknown = CliRunner().invoke(app, ["configs", "show", "nope"])
    assert unknown.exit_code == 2 and "shipped: default" in unknown.output
    bad = CliRunner().invoke(app, ["train", "nope"])
    assert bad.exit_code == 2 and "config file not found" in bad.output
