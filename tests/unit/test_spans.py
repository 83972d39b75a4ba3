"""The workflow span helper with a real OpenTelemetry SDK provider: current while its block runs, put back after,
errors recorded; and a coroutine closed from another context (as the garbage collector closes an evicted
workflow's) ends its span without OpenTelemetry's "Failed to detach context" error and its traceback."""

from __future__ import annotations

import contextvars
import logging

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode, get_current_span

from trajflow.observability import spans


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(spans.opentelemetry.trace, "get_tracer", lambda name: provider.get_tracer(name))
    return exporter


def test_the_span_is_current_in_its_block_and_the_outer_one_after(exported: InMemorySpanExporter) -> None:
    before = get_current_span()
    with spans.span("env.step", turn=2, sandbox=None) as outer:
        assert get_current_span() is outer
        with spans.span("inner") as inner:
            assert get_current_span() is inner
        assert get_current_span() is outer
    assert get_current_span() is before
    done = {s.name: s for s in exported.get_finished_spans()}
    assert set(done) == {"env.step", "inner"}
    assert dict(done["env.step"].attributes or {}) == {"trajflow.turn": 2}
    assert done["inner"].parent is not None and done["inner"].parent.span_id == outer.get_span_context().span_id


def test_an_error_in_the_block_is_recorded_and_raised(exported: InMemorySpanExporter) -> None:
    with pytest.raises(ValueError, match="no sandbox"), spans.span("env.reset"):
        raise ValueError("no sandbox")
    (done,) = exported.get_finished_spans()
    assert done.status.status_code is StatusCode.ERROR
    assert [e.name for e in done.events] == ["exception"]


def test_a_coroutine_closed_in_another_context_logs_no_detach_error(
    exported: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    async def turn() -> None:
        with spans.span("llm.generate", turn=0):
            await _Suspend()

    coro = turn()
    contextvars.copy_context().run(coro.send, None)  # runs up to the await, in one context
    with caplog.at_level(logging.DEBUG):
        contextvars.copy_context().run(coro.close)  # closed from another, as the collector does
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert [s.name for s in exported.get_finished_spans()] == ["llm.generate"]


class _Suspend:
    def __await__(self):  # a bare suspension point, as a workflow awaiting an activity
        yield
