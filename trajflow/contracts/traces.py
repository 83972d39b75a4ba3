"""The spans of a trajectory as the workers write them (one JSON line per span, `trajflow.observability.tracing`) and
`trajflow trace` reads them back (`trajflow.observability.timeline`); and the names of trajflow's span attributes.

The span names: `trajectory` (the workflow, root of its own trace), one per activity call from the workflow
(`env.reset`, `llm.generate`, `env.step`, `env.close`, `reward.score`, `trajectory.save`: scheduled to result,
retries included) and, beneath each, `run <activity>` (its execution on a worker, one per attempt).
"""

from __future__ import annotations

from trajflow.contracts.base import Contract

SPAN_PREFIX = "trajflow."
"""Every attribute trajflow sets on a span is named `trajflow.<name>`."""

ROOT_SPAN = "trajectory"
RUN_PREFIX = "run "
"""The span of an activity's execution on its worker: `run <activity type>`."""


def attr(name: str) -> str:
    """The span attribute `name`, as set and as read back."""
    return SPAN_PREFIX + name


class SpanRecord(Contract):
    """One finished span: ids in hex as OTLP writes them, times in Unix nanoseconds."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    service: str
    """The worker process that made it: `trajflow-<role>`."""
    start_ns: int
    end_ns: int
    status: str
    """`unset`, `ok` or `error`."""
    error: str | None = None
    attributes: dict[str, str | int | float | bool]

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9
