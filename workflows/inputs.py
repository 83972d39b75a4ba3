"""A workflow's own input, decoded in workflow code so that bad input fails the workflow, not its task.

The SDK decodes workflow arguments before any workflow code runs, and a payload that does not validate (malformed
JSON, `{"seed": "abc"}`, an unknown field) fails the *workflow task*, which Temporal retries forever: the
workflow would stay Running with nothing to show but a task failure. So the workflows take their input as a
`RawValue` and decode it here, with the worker's (pydantic) payload converter:

- input from outside (the Temporal UI, `temporal workflow start`, any client) that does not validate ends the
  workflow FAILED with a non-retryable `InvalidWorkflowInput` error naming each bad field and what it expects;
- input our own code wrote (a continue-as-new carrying state, a child started by a training run) that does not
  validate is a bug or a version skew between workers: that still fails the task, so a fixed worker picks the
  workflow up again and nothing is lost;
- no input at all means `{}`: every field's default.

Limits: only the workflow input; signals that do not decode are dropped and logged by the SDK (with the
validation error), queries fail to their caller. Values a workflow computes are validated where built.
"""

from __future__ import annotations

from typing import TypeVar

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from trajflow.contracts import names
    from trajflow.contracts.errors import explain_invalid

M = TypeVar("M")

NO_INPUT = RawValue(Payload(metadata={"encoding": b"json/plain"}, data=b"{}"))
"""The default of a workflow's input parameter: a start with no input runs with every default."""


def decode_input(raw: RawValue, model: type[M]) -> M:
    """The workflow input as `model`; raises as the module docstring says when it does not validate."""
    try:
        value = workflow.payload_converter().from_payload(raw.payload, model)
        if not isinstance(value, model):
            raise TypeError(f"decoded to {type(value).__name__}, not {model.__name__}")
        return value
    except Exception as e:
        message = explain_invalid(model, e, "fix the workflow input")  # type: ignore[arg-type]
        info = workflow.info()
        if info.continued_run_id or info.parent:
            raise RuntimeError(f"input written by this workflow's own code does not decode: {message}") from e
        raise ApplicationError(message, type=names.ERR_INVALID_INPUT, non_retryable=True) from None
