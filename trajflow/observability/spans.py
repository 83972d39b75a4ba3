"""Spans made inside workflows: `span(name, **attributes)` around an activity call or the whole trajectory.

Safe in workflow code: the tracer comes from the process's provider at call time (`trajflow.observability.tracing`),
which is the SDK's replay-safe one in a traced worker (deterministic ids; spans that end during a replay are not
exported again) and OpenTelemetry's no-op one anywhere else (an untraced worker, the replayer of the tests), where a
span costs nothing. Attribute names get the `trajflow.` prefix; None values are left out.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import opentelemetry.trace
from opentelemetry.trace import Span

from trajflow.contracts.traces import attr

Value = str | int | float | bool | None


@contextmanager
def span(name: str, **attributes: Value) -> Iterator[Span]:
    """A span for the block, current while it runs (so an activity scheduled in it carries its context)."""
    tracer = opentelemetry.trace.get_tracer("trajflow.workflows")
    with tracer.start_as_current_span(name, attributes=_named(attributes)) as current:
        yield current


def note(current: Span, **attributes: Value) -> None:
    """Add attributes learnt while the span runs (a result's reward, a completion's policy version)."""
    current.set_attributes(_named(attributes))


def _named(attributes: dict[str, Value]) -> dict[str, str | int | float | bool]:
    return {attr(k): v for k, v in attributes.items() if v is not None}
