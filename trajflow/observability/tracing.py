"""One OpenTelemetry trace per trajectory, made by the worker processes.

`configure` gives a worker process a replay-safe tracer provider (the Temporal SDK's, whose ids come from the
workflow's deterministic random, so a replayed workflow re-creates the same spans and never exports them twice) and
its exporter: OTLP/HTTP when the settings name an endpoint, else one JSON-lines file per process under
`Settings.traces_dir` (the format `trajflow.observability.timeline` reads back for `trajflow trace`). `plugins` is what
`trajflow.infra.temporal.connect` hands the client: the SDK's `OpenTelemetryPlugin`, which carries the span context from
a workflow into its activities, and `ActivitySpans`, which opens a span around each activity's execution on its
worker (`run llm.generate`: attempt, worker, how long the task waited to be picked up).

The spans of a trajectory are made by the workflow (`trajflow.observability.spans`): the root `trajectory` span, and one
span per activity call, from its scheduling to its result, retries included. Not covered: the training workflow and
the trainer's steps (no spans); spans still in a process's batch (half a second) when it is killed are lost.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import opentelemetry.trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from temporalio import activity
from temporalio.contrib.opentelemetry import OpenTelemetryPlugin, create_tracer_provider
from temporalio.plugin import SimplePlugin
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from trajflow.contracts.traces import RUN_PREFIX, SpanRecord, attr

_STATE: dict[str, str] = {}
"""`service` and `destination` of this process, once `configure` ran."""


def configure(traces: bool, otlp_endpoint: str | None, traces_dir: Path, service: str) -> str | None:
    """Make this process's tracer provider (once); returns where its spans go (the OTLP URL or the file), or
    None when tracing is off. `service`: the worker's role (`orchestrator`, `decode`, ...)."""
    if not traces:
        return None
    if _STATE:
        return _STATE["destination"]
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        destination = traces_url(otlp_endpoint)
        install(OTLPSpanExporter(endpoint=destination), service, destination)
    else:
        path = traces_dir / f"{service}-{socket.gethostname()}-{os.getpid()}.jsonl"
        install(JsonLinesExporter(path), service, str(path))
    return _STATE["destination"]


def install(exporter: SpanExporter, service: str, destination: str, sample: float = 1.0) -> None:
    """Make the process's provider with this exporter; `sample`: the share of trajectories traced (decided by
    the root span's trace id, which the workflow's deterministic random makes, so a replay decides alike)."""
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    resource = Resource.create({"service.name": f"trajflow-{service}"})
    sampler = ParentBased(TraceIdRatioBased(sample)) if sample < 1.0 else None
    provider = create_tracer_provider(resource=resource, sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    opentelemetry.trace.set_tracer_provider(provider)
    _STATE.update(service=service, destination=destination)


def plugins() -> list[SimplePlugin]:
    """The client plugins of a process `configure` set up (none otherwise). The SDK's plugin comes first, so that
    `ActivitySpans` runs inside it, with the workflow's span context already attached."""
    if not _STATE:
        return []
    return [OpenTelemetryPlugin(), SimplePlugin("trajflow-activity-spans", interceptors=[ActivitySpans()])]


def flush() -> None:
    """Export the spans still in the batch (a worker calls it as it stops)."""
    provider = opentelemetry.trace.get_tracer_provider()
    if _STATE and hasattr(provider, "force_flush"):
        provider.force_flush(5_000)  # type: ignore[attr-defined]


def traces_url(endpoint: str) -> str:
    """An OTLP/HTTP endpoint as the exporter wants it: the collector's base URL gets `/v1/traces`."""
    trimmed = endpoint.rstrip("/")
    return trimmed if trimmed.endswith("/v1/traces") else f"{trimmed}/v1/traces"


class ActivitySpans(Interceptor):
    """A span around every activity's execution on its worker, under the workflow's span for the call."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ActivitySpanInbound(next)


class _ActivitySpanInbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        waited = (info.started_time - info.current_attempt_scheduled_time).total_seconds()
        attributes = {
            attr("attempt"): info.attempt,
            attr("task_queue"): info.task_queue,
            attr("workflow_id"): info.workflow_id or "",
            attr("pickup_wait_s"): round(max(waited, 0.0), 6),
        }
        tracer = opentelemetry.trace.get_tracer("trajflow.activities")
        with tracer.start_as_current_span(f"{RUN_PREFIX}{info.activity_type}", attributes=attributes):
            return await super().execute_activity(input)


class JsonLinesExporter(SpanExporter):
    """Each span as one line of `trajflow.contracts.traces.SpanRecord` JSON, appended to one file per process."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._file = path.open("a", encoding="utf-8")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = [record_of(s).model_dump_json() + "\n" for s in spans]
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.writelines(lines)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def record_of(span: ReadableSpan) -> SpanRecord:
    """The line of one finished span."""
    context = span.get_span_context()
    assert context is not None, "a finished SDK span has a context"
    parent = span.parent
    return SpanRecord(
        trace_id=f"{context.trace_id:032x}",
        span_id=f"{context.span_id:016x}",
        parent_id=f"{parent.span_id:016x}" if parent is not None else None,
        name=span.name,
        service=str(span.resource.attributes.get("service.name", "")),
        start_ns=span.start_time or 0,
        end_ns=span.end_time or 0,
        status=span.status.status_code.name.lower(),
        error=span.status.description,
        attributes={k: _scalar(v) for k, v in (span.attributes or {}).items()},
    )


def _scalar(value: object) -> str | int | float | bool:
    if isinstance(value, str | int | float | bool):
        return value
    return json.dumps(list(value)) if isinstance(value, Sequence) else str(value)
