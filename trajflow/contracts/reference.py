"""The run config reference: a Markdown page rendered from `RunConfig`'s schema and its field docstrings.

`render()` walks `RunConfig` and every model reachable from its fields (through lists, dicts, optionals and the
variants of a discriminated union), breadth first, and writes one section per model: where it sits in a run
config's TOML, the model's docstring, and per field its type, constraints, default and description (the attribute
docstring under the field, which `Contract`'s `use_attribute_docstrings` turns into `FieldInfo.description`).

    python -m trajflow.contracts.reference > docs/reference/config.md

`tests/unit/test_config_reference.py` fails when the committed page differs from what this renders. Not covered:
validators' cross-field rules (e.g. a task's pools must be declared) appear only where a docstring states them;
a default longer than `MAX_DEFAULT` characters is shortened.
"""

from __future__ import annotations

import inspect
import json
import sys
import types
from enum import Enum
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from trajflow.contracts.config import RunConfig

COMMAND = "python -m trajflow.contracts.reference > docs/reference/config.md"
MAX_DEFAULT = 100
CONSTRAINTS = {
    "gt": ">",
    "ge": "≥",
    "lt": "<",
    "le": "≤",
    "min_length": "length ≥",
    "max_length": "length ≤",
    "multiple_of": "multiple of",
}


def models_in(tp: Any) -> list[type[BaseModel]]:
    """The models an annotation names, in order: `list[TaskConfig]`, `dict[str, A | B]`, `A | None`, ..."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for arg in get_args(tp) for m in models_in(arg)]


def type_name(tp: Any) -> str:
    """A short, readable name of an annotation: `int`, `list[TaskConfig]`, `"hf" | "vllm"`, `str | None`."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return type_name(args[0])
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if tp is type(None):
        return "None"
    if isinstance(tp, type) and issubclass(tp, Enum):
        return " | ".join(json.dumps(m.value) for m in tp)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(a) for a in args)}]"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def constraints(field: FieldInfo) -> str:
    """The field's bounds (`≥ 1, ≤ 200`), from its metadata."""
    out = []
    for meta in field.metadata:
        for attr, sign in CONSTRAINTS.items():
            value = getattr(meta, attr, None)
            if value is not None:
                out.append(f"{sign} {value}")
    return ", ".join(out)


def default_text(field: FieldInfo) -> str:
    """The default as TOML-ish JSON in a code span, `required`, or the nested model's own defaults."""
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True, validated_data={})
    if isinstance(value, BaseModel):
        return f"`{type(value).__name__}()`" if value == type(value)() else code(value.model_dump(mode="json"))
    if isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
        return f"`[{', '.join(f'{type(v).__name__}()' for v in value)}]`"
    if value is None:
        return "none"
    return code(value.value if isinstance(value, Enum) else value)


def code(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    if len(text) > MAX_DEFAULT:
        text = text[: MAX_DEFAULT - 1] + "…"
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def one_line(text: str | None) -> str:
    return " ".join(inspect.cleandoc(text).split()) if text else ""


def anchor(model: type[BaseModel]) -> str:
    return f"[{model.__name__}](#{model.__name__.lower()})"


def walk(root: type[BaseModel]) -> list[tuple[type[BaseModel], str]]:
    """Every model reachable from `root`, breadth first, with the TOML table it first appears at."""
    seen: dict[type[BaseModel], str] = {root: ""}
    queue = [root]
    while queue:
        model = queue.pop(0)
        for name, field in model.model_fields.items():
            key = field.alias or name
            for sub in models_in(field.annotation):
                if sub in seen:
                    continue
                seen[sub] = table_path(seen[model], key, field.annotation)
                queue.append(sub)
    return list(seen.items())


def table_path(parent: str, key: str, tp: Any) -> str:
    """`[train.trainer]`, `[[tasks]]`, `[reward_models.NAME]`: where a nested model sits in the TOML."""
    dotted = f"{parent.strip('[]')}.{key}" if parent else key
    origin = get_origin(tp)
    if origin is list:
        return f"[[{dotted}]]"
    if origin is dict:
        return f"[{dotted}.NAME]"
    return f"[{dotted}]"


def render_model(model: type[BaseModel], path: str) -> list[str]:
    lines = [f"## {model.__name__}", ""]
    lines += [f"TOML: `{path}`" if path else "The whole run config file.", ""]
    if doc := one_line(model.__doc__):
        lines += [doc, ""]
    for name, field in model.model_fields.items():
        kind = f"`{type_name(field.annotation)}`"
        bounds = constraints(field)
        nested = models_in(field.annotation)
        parts = [kind + (f" ({bounds})" if bounds else ""), f"default {default_text(field)}"]
        text = one_line(field.description)
        if nested:
            text = f"{text} See {', '.join(anchor(m) for m in nested)}.".strip()
        lines.append(f"- **`{field.alias or name}`**: {'; '.join(parts)}." + (f" {text}" if text else ""))
    return [*lines, ""]


def render(root: type[BaseModel] = RunConfig) -> str:
    """The whole reference page for `root` (by default the run config)."""
    lines = [
        "# Run config reference",
        "",
        f"Every field of `{root.__name__}` (`trajflow/contracts/config.py`) and of every model under it, generated "
        "from the field docstrings by",
        "",
        f"    {COMMAND}",
        "",
        "Do not edit it by hand: a unit test fails when it is stale. A run config is a TOML file, or a shipped "
        "config's name (`trajflow configs list`, e.g. `default`: `trajflow/configs/default.toml`); every field has a "
        "default, and an unknown field is an error that names it.",
        "",
    ]
    for model, path in walk(root):
        lines += render_model(model, path)
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
