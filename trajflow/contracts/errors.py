"""Messages for input that does not validate: one line naming every bad field, what it expects and what to fix.

Used where a user's input is refused (a workflow started from the UI or a client, `trajflow rollout --request`,
a reward service's answer), so the message is the same wherever the input came from, e.g.

    TrajectoryRequest: seed: Input should be a valid integer, unable to parse string as an integer (got 'abc')
    — fix the workflow input

Limits: pure (pydantic and stdlib); the message is cut to `MAX_MESSAGE_CHARS` (it lands in workflow history)
and never quotes more than a few dozen characters of any input value.
"""

from __future__ import annotations

import typing

from pydantic import BaseModel, ValidationError

MAX_MESSAGE_CHARS = 2000
_SHOWN_CHARS = 60


def explain_invalid(model: type[BaseModel], err: BaseException, fix: str) -> str:
    """`err` (a ValidationError from validating `model`, or any decoding error) as one line ending in `fix`."""
    if isinstance(err, ValidationError):
        problems = [_problem(model, e) for e in err.errors(include_url=False)]
    else:
        problems = [f"{type(err).__name__}: {err}"]
    text = f"{model.__name__}: {'; '.join(problems)} — {fix}"
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."


def _problem(model: type[BaseModel], error: typing.Any) -> str:
    loc = tuple(error.get("loc", ()))
    where = ".".join(str(part) for part in loc)
    kind = error.get("type", "")
    if kind == "json_invalid":
        return f"{error['msg']} (the input must be one JSON object, e.g. {{}} for every default)"
    if kind == "model_type" and not loc:
        return f"{error['msg']}, got {_shown(error.get('input'))} (use {{}} for every default)"
    if kind == "extra_forbidden":
        known = _fields_at(model, loc[:-1])
        hint = f" (known fields: {', '.join(known)})" if known else ""
        return f"{where}: not a field{hint}"
    if kind == "missing":
        return f"{where}: {error['msg']}"
    if kind == "value_error":  # a validator's own message, which names the value already (a whole model's: no loc)
        said = str(error["msg"]).removeprefix("Value error, ")
        return f"{where}: {said}" if where else said
    return f"{where}: {error['msg']} (got {_shown(error.get('input'))})"


def _shown(value: object) -> str:
    if isinstance(value, (str, bytes)) and len(value) > _SHOWN_CHARS:
        return f"a {type(value).__name__} of {len(value)} characters"
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _fields_at(model: type[BaseModel], path: tuple[object, ...]) -> list[str]:
    """The field names of the (nested) model at `path`, or [] where the path leads to no model."""
    current: type[BaseModel] | None = model
    for part in path:
        if current is None:
            return []
        if isinstance(part, int):
            continue  # an index into a list of models
        field = current.model_fields.get(str(part))
        current = _model_in(field.annotation) if field is not None else None
    return sorted(current.model_fields) if current is not None else []


def _model_in(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
