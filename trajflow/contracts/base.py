"""The base class of every contracts model, and the one place that says how all of them treat fields and floats.

- `extra="forbid"`: an unknown (misspelt) field is an error that names it, never silently dropped.
- Frozen: a model that crossed a boundary is a value; `MutableContract` is for state a workflow or a builder
  updates in place (the training workflow's state, counters, groups).
- NaN and infinity: written as the JSON constants `NaN`, `Infinity` and `-Infinity`, never `null`. A `null` fails to
  decode as a float on the other side: a workflow task that fails forever, a stored record nobody can read. Both
  pydantic's and Python's JSON parsers read the constants back. Where a value must be finite (a reward that is
  trained on), its field is a `FiniteFloat` (or has bounds, which NaN never meets) and validation refuses NaN and
  infinity, with a message naming the field.

Limits: the constants are not strict JSON (RFC 8259); a reader in another language must accept them (JavaScript's
`JSON.parse` does not). Only pydantic and the standard library are imported.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
"""A float that may not be NaN or infinite: validation refuses them ("Input should be a finite number")."""
JsonScalar = str | int | float | bool | None
"""What env kwargs and env info values may hold, so they stay JSON-serialisable and small."""


class Contract(BaseModel):
    """Every contracts model derives from this (a unit test walks them all)."""

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants", use_attribute_docstrings=True)


class MutableContract(Contract):
    """A contract whose fields may be assigned after construction (assignments are not re-validated)."""

    model_config = ConfigDict(frozen=False)


class ToolFunction(Contract):
    """The function a tool call calls (OpenAI's `tool_calls[].function`)."""

    name: str
    arguments: str
    """Its arguments as a JSON string, as the OpenAI API carries them."""


class ToolCall(Contract):
    """One tool call of an assistant message (OpenAI's `tool_calls[]`)."""

    id: str
    type: Literal["function"] = "function"
    function: ToolFunction


class ChatMessage(Contract):
    """One message of a chat conversation, as the context records it (`trajflow.contracts.records.TurnContext`)."""

    role: str
    """`system`, `user`, `assistant` or `tool` (an agent's tool result)."""
    content: str
    tool_calls: list[ToolCall] | None = None
    """An assistant message's tool calls (agent turns with tools); None in a message without."""
    tool_call_id: str | None = None
    """A `tool` message's answer to which call."""
