"""Spans made inside workflows: `span(name, **attributes)` around an activity call or the whole trajectory.

Safe in workflow code: the tracer comes from the process's provider at call time (`trajflow.observability.tracing`),
which is the SDK's replay-safe one in a traced worker (deterministic ids; spans that end during a replay are not
exported again) and OpenTelemetry's no-op one anywhere else (an untraced worker, the replayer of the tests), where a
span costs nothing. Attribute names get the `trajflow.` prefix; None values are left out.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import opentelemetry.context
import opentelemetry.trace
from opentelemetry.trace import Span, Status, StatusCode

from trajflow.contracts.traces import attr

Value = str | int | float | bool | None


@contextmanager
def span(name: str, **attributes: Value) -> Iterator[Span]:
    """A span for the block, current while it runs (so an activity scheduled in it carries its context).

    The block's context is put back when the block ends, but not when its coroutine is being closed (`GeneratorExit`
    thrown into it): a workflow's coroutine garbage-collected unfinished runs this exit in whatever context the
    collector happens to run in, where detaching fails and OpenTelemetry would log that failure with a traceback from
    inside the collector (formatting a traceback parses source, and on CPython 3.11 a parse nested in another one,
    such as pytest's own report of a failure, fails that one with "AST constructor recursion depth mismatch"). The
    context of a coroutine being closed ends with it.
    """
    tracer = opentelemetry.trace.get_tracer("trajflow.workflows")
    current = tracer.start_span(name, attributes=_named(attributes))
    token = opentelemetry.context.attach(opentelemetry.trace.set_span_in_context(current))
    closed_by_collector = False
    try:
        yield current
    except GeneratorExit:
        closed_by_collector = True
        raise
    except Exception as exc:
        current.record_exception(exc)
        current.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        current.end()
        if not closed_by_collector:
            opentelemetry.context.detach(token)


def note(current: Span, **attributes: Value) -> None:
    """Add attributes learnt while the span runs (a result's reward, a completion's policy version)."""
    current.set_attributes(_named(attributes))


def _named(attributes: dict[str, Value]) -> dict[str, str | int | float | bool]:
    return {attr(k): v for k, v in attributes.items() if v is not None}
