"""The config reference (docs/reference/config.md) is what `trajflow.contracts.reference` renders from `RunConfig`'s
field docstrings: a stale page fails here, naming the command that regenerates it."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from trajflow.contracts.config import RunConfig
from trajflow.contracts.reference import COMMAND, default_text, render, type_name, walk

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "config.md"


def test_the_committed_reference_is_current() -> None:
    assert PAGE.read_text() == render(), f"docs/reference/config.md is stale: run `{COMMAND}`"


def test_every_model_of_the_run_config_has_a_section() -> None:
    models = dict(walk(RunConfig))
    assert models[RunConfig] == ""
    names = {m.__name__: path for m, path in models.items()}
    assert names["TaskConfig"] == "[[tasks]]"
    assert names["LossConfig"] == "[train.trainer.loss]"
    assert names["JudgeModelConfig"] == names["LocalModelConfig"] == "[reward_models.NAME]"
    page = render()
    for model in models:
        assert f"\n## {model.__name__}\n" in page


def test_field_docstrings_are_descriptions() -> None:
    """Contract's `use_attribute_docstrings`: the docstring under a field is its description."""
    field = RunConfig.model_fields["train"].annotation
    assert isinstance(field, type) and issubclass(field, BaseModel)
    assert (field.model_fields["alpha"].description or "").startswith("Staleness bound")


def test_types_and_defaults_read_as_toml() -> None:
    fields = RunConfig.model_fields
    assert type_name(fields["tasks"].annotation) == "list[TaskConfig]"
    assert default_text(fields["tasks"]) == "`[TaskConfig()]`"
    assert default_text(fields["reward_models"]) == "`{}`"
