"""Contracts as a whole: dead fields stay gone, records written by an older trajflow stay readable."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.scoring import ScoreInput, ScoreRequest
from trajflow.contracts.trajectory import TrajectoryRequest, TrajectoryStatus


def test_score_input_holds_only_the_request() -> None:
    assert set(ScoreInput.model_fields) == {"request"}
    with pytest.raises(ValidationError):
        ScoreInput.model_validate({"pool": "default", "request": ScoreRequest(env_id="game:x").model_dump()})


def test_a_record_saved_with_the_old_empty_extra_field_still_loads() -> None:
    record = TrajectoryRecord(
        workflow_id="w", request=TrajectoryRequest(), status=TrajectoryStatus.COMPLETED, reward=1.0,
        first_observation="o", turns=[], context=None, env_recoveries=0,
    )  # fmt: skip
    assert "extra" not in record.model_dump()
    old = {**record.model_dump(mode="json"), "extra": {}}
    assert TrajectoryRecord.model_validate(old) == record
    with pytest.raises(ValidationError):
        TrajectoryRecord.model_validate({**old, "extra": {"something": 1}})


# --- one base class, one NaN/infinity rule ----------------------------------------------------------------------

import enum  # noqa: E402
import importlib  # noqa: E402
import inspect  # noqa: E402
import math  # noqa: E402
import pkgutil  # noqa: E402
import types  # noqa: E402
import typing  # noqa: E402
from typing import Any  # noqa: E402

from pydantic import BaseModel, TypeAdapter  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402

import trajflow.contracts as contracts  # noqa: E402
from trajflow.contracts.base import Contract  # noqa: E402

NON_FINITE = (math.nan, math.inf, -math.inf)
_STRINGS = ("default", "game:GuessTheNumber-v0-easy")


def contract_models() -> list[type[BaseModel]]:
    """Every pydantic model defined in a `contracts` module."""
    found: dict[str, type[BaseModel]] = {}
    for info in pkgutil.iter_modules(contracts.__path__):
        module = importlib.import_module(f"trajflow.contracts.{info.name}")
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, BaseModel) and obj.__module__ == module.__name__:
                found[obj.__qualname__] = obj
    return sorted(found.values(), key=lambda m: m.__name__)


def _sample(annotation: Any, field: Any = None) -> Any:
    """A valid value of a field's type (enough to build a model with every required field set)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _sample(args[0], field)
    if origin in (typing.Union, types.UnionType):
        return None if type(None) in args else _sample(args[0], field)
    if origin is typing.Literal:
        return args[0]
    if origin is list:
        return [_sample(args[0])] if args else []
    if origin is tuple:
        return tuple(_sample(a) for a in args)
    if origin is dict:
        return {}
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return _build(annotation)
    if inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        return next(iter(annotation))
    if annotation is str:
        check = TypeAdapter(typing.Annotated[str, field]) if field is not None else TypeAdapter(str)
        for s in _STRINGS:
            try:
                return check.validate_python(s)
            except ValueError:
                continue
    return {bool: False, int: 0, float: 0.0, str: "x"}[annotation]


_KNOWN_VALUES: dict[str, dict[str, Any]] = {
    "HostConfig": {"runs": ["orchestrator"]},
    "OpenAIServerConfig": {"base_url": "http://127.0.0.1:8000/v1"},
    "JudgeModelConfig": {"base_url": "http://127.0.0.1:8000/v1"},
    "LocalModelConfig": {"url": "http://127.0.0.1:8090"},
    "LocalScoreResult": {"batch_size": 1},
    "BranchPlan": {"turn": 1},
}
"""Required fields whose valid values a type-driven sample cannot guess (checked by a validator)."""


def _build(model: type[BaseModel]) -> BaseModel:
    required = {name: _sample(f.annotation, f) for name, f in model.model_fields.items() if f.is_required()}
    return model.model_validate({**required, **_KNOWN_VALUES.get(model.__name__, {})})


def _float_shape(annotation: Any) -> Any:
    """How to put a non-finite float into a field of this type: a function of the float, or None (no float)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _float_shape(args[0])
    if origin in (typing.Union, types.UnionType):
        return (
            _float_shape(args[0])
            if float in args or any(typing.get_origin(a) is typing.Annotated for a in args)
            else None
        )
    if annotation is float:
        return lambda x: x
    if origin is list and args and _float_shape(args[0]) is not None:
        return lambda x: [x]
    if origin is dict and args and _float_shape(args[1]) is not None:
        return lambda x: {"k": x}
    return None


def _floats(value: Any) -> list[float]:
    if isinstance(value, float):
        return [value]
    if isinstance(value, list):
        return [v for item in value for v in _floats(item)]
    if isinstance(value, dict):
        return [v for item in value.values() for v in _floats(item)]
    return []


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


MODELS = contract_models()


def test_the_walk_finds_the_models() -> None:
    names = {m.__name__ for m in MODELS}
    assert {"TrajectoryRequest", "TurnContext", "TrainingState", "RunConfig", "EnvReplayResult", "ScoreResult"} <= names


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_contract_derives_from_the_one_base_and_keeps_its_float_rule(model: type[BaseModel]) -> None:
    assert issubclass(model, Contract), f"{model.__name__} does not derive from trajflow.contracts.base.Contract"
    assert model.model_config.get("ser_json_inf_nan") == "constants"
    assert model.model_config.get("extra") == "forbid"


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_nan_and_infinity_round_trip_or_are_refused_in_every_float_field(model: type[BaseModel]) -> None:
    """Each float field either refuses NaN/±inf at validation (its rule: finite), or carries them through the
    Temporal payload converter and the store's JSON unchanged: never a silent `null` that fails to decode later."""
    base = _build(model).model_dump()
    conv = pydantic_data_converter.payload_converter
    for name, field in model.model_fields.items():
        shape = _float_shape(field.annotation)
        if shape is None:
            continue
        for x in NON_FINITE:
            try:
                inst = model.model_validate({**base, name: shape(x)})
            except ValueError:
                continue  # the field's rule: finite (or bounded) values only
            for back in (
                conv.from_payload(conv.to_payload(inst), model),
                model.model_validate_json(inst.model_dump_json()),
            ):
                got = _floats(getattr(back, name))
                assert len(got) == 1 and _same(got[0], x), f"{model.__name__}.{name}: {x} came back as {got}"


def test_rewards_that_are_trained_on_refuse_nan_and_infinity() -> None:
    from trajflow.contracts.scoring import ScoreResult
    from trajflow.contracts.trajectory import TrajectoryReport

    for model, name in ((ScoreResult, "reward"), (TrajectoryReport, "reward")):
        base = _build(model).model_dump()
        for x in NON_FINITE:
            with pytest.raises(ValueError, match="finite number"):
                model.model_validate({**base, name: x})


# --- query and signal names are constants -------------------------------------------------------------------------

import ast  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
_MESSAGE_CALLS = {"query", "signal", "execute_update", "start_update", "get_update_handle"}
_HANDLERS = {"query", "signal", "update"}


def _sources() -> list[Path]:
    """The project's own Python files: not under a hidden directory (`.venv`, `.vllm-venv`, `.git`) or a build one."""
    skip = {"node_modules", "build", "dist"}
    parts = lambda p: p.relative_to(REPO).parts  # noqa: E731
    return [p for p in REPO.rglob("*.py") if not skip & set(parts(p)) and not any(x.startswith(".") for x in parts(p))]


def test_query_signal_and_update_names_come_from_contracts_names() -> None:
    """Every `@workflow.query/signal/update` names its handler with a constant of `trajflow.contracts.names`, and no
    client queries or signals a workflow by a string literal."""
    bad = []
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for dec in node.decorator_list:
                    target = dec.func if isinstance(dec, ast.Call) else dec
                    if not (isinstance(target, ast.Attribute) and target.attr in _HANDLERS
                            and isinstance(target.value, ast.Name) and target.value.id == "workflow"):  # fmt: skip
                        continue
                    name = (
                        next((k.value for k in dec.keywords if k.arg == "name"), None)
                        if isinstance(dec, ast.Call)
                        else None
                    )
                    if not (
                        isinstance(name, ast.Attribute)
                        and isinstance(name.value, ast.Name)
                        and name.value.id == "names"
                    ):
                        bad.append(f"{where}: @workflow.{target.attr} without name=names.<CONSTANT>")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MESSAGE_CALLS
                    and node.args and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)):  # fmt: skip
                bad.append(
                    f"{where}: .{node.func.attr}({node.args[0].value!r}, ...) names a message by a string literal"
                )
    assert not bad, "\n".join(bad)
