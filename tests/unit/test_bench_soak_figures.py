"""The arithmetic of `bench scale` and `bench soak` (no Temporal): the overhead per activity from real SDK spans,
quantiles, what saturates first, and the soak's loss audit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import set_span_in_context

from trajflow.contracts.traces import attr
from trajflow.lab.bench.sandboxes_report import percentile
from trajflow.lab.bench.scale import LevelFigures, ScaleWorkload, overhead_ms, quick_scale, saturation
from trajflow.lab.bench.soak import audit
from trajflow.observability.tracing import record_of

MS = 1_000_000


def _spans(run_id: str, calls: list[tuple[int, int]]) -> list:
    """One traced trajectory: a root, and per (call ms, run ms) a call span with one run beneath it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    root = tracer.start_span("trajectory", attributes={attr("workflow_id"): f"{run_id}-000001"}, start_time=0)
    t = 0
    for call_ms, run_ms in calls:
        call = tracer.start_span("llm.generate", set_span_in_context(root), start_time=t)
        run = tracer.start_span("run llm.generate", set_span_in_context(call), start_time=t + MS)
        run.end(end_time=t + MS + run_ms * MS)
        call.end(end_time=t + call_ms * MS)
        t += call_ms * MS
    root.end(end_time=t)
    return [record_of(span) for span in exporter.get_finished_spans()]


def test_overhead_is_each_call_minus_its_run_on_a_worker() -> None:
    spans = _spans("scale-100-abc", [(110, 100), (205, 200), (1030, 1000)])
    spans += _spans("scale-1000-xyz", [(5000, 10)])  # another level's trajectory is not counted
    o = overhead_ms(spans, "scale-100-abc")
    assert o["samples"] == 3 and o["trajectories"] == 1
    assert o["p50"] == pytest.approx(10.0)
    assert o["p99"] == pytest.approx(10.0 + 0.98 * 20.0, abs=0.01)  # 98% of the way from 10 ms to 30 ms
    assert o["mean"] == pytest.approx(15.0)
    assert overhead_ms(spans, "scale-5000") == {"samples": 0}


def test_quantiles_interpolate() -> None:  # the percentile the overhead figures use
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([7.0], 99) == 7.0


def _level(cpu: dict[str, float]) -> LevelFigures:
    return LevelFigures(
        in_flight=1000, trajectories_per_s=1.0, activities_per_s=20.0, overhead_ms={}, lost=0, started=1, completed=1,
        unfinished=0, not_completed={}, cpu_cores=cpu, history={}, saturated="", fill_s=1.0, drain_s=1.0,
        demand_activities_per_s=20.0,
    )  # fmt: skip


def test_what_saturates_first() -> None:
    machine = saturation(_level({"orchestrator": 0.9, "server": 0.8, "decode": 0.1, "driver": 0.02}), 2)
    assert machine.startswith("the machine's 2 cores (1.82 busy: orchestrator 0.90, server 0.80, decode 0.10)")
    assert saturation(_level({"orchestrator": 0.95, "server": 0.3}), 4) == "the orchestrator process (0.95 of a core)"
    assert saturation(_level({"orchestrator": 0.2, "server": 0.9}), 4) == "the Temporal server (0.90 of a core)"
    assert saturation(_level({"orchestrator": 0.2, "server": 0.2}), 2).startswith("nothing yet (0.40 of 2 cores")


def test_workloads() -> None:
    w = ScaleWorkload()
    assert w.levels == (100, 1000, 5000) and w.activities_per_trajectory == 12 and w.trajectory_s == 80.0
    q = quick_scale(window_s=5.0)
    assert q.levels == (20, 100) and q.window_s == 5.0 and q.activities_per_trajectory == 10


def _result(steps: int, batch: int, **counters: int) -> SimpleNamespace:
    history = [SimpleNamespace(step=i, trajectories=batch) for i in range(1, steps + 1)]
    base = dict(started=0, completed=0, failed=0, infra_failed=0, cancelled=0, consumed=steps * batch)
    return SimpleNamespace(history=history, version=steps, counters=SimpleNamespace(**{**base, **counters}))


def test_the_soak_audit_adds_everything_up() -> None:
    ok = _result(3, 4, started=14, completed=13, cancelled=0)
    assert audit(ok, 3, 4, {"COMPLETED": 13, "RUNNING": 1}, running=1) == []
    lost = audit(ok, 3, 4, {"COMPLETED": 12, "RUNNING": 1}, running=1)
    assert lost and "visibility holds 13" in lost[0]
    unaccounted = audit(_result(3, 4, started=14, completed=12), 3, 4, {"COMPLETED": 13, "RUNNING": 1}, running=1)
    assert any("still running 1" in p for p in unaccounted)
    skipped = _result(3, 4, started=14, completed=13)
    skipped.history = [skipped.history[0], skipped.history[2]]
    assert any("not 1..3" in p for p in audit(skipped, 3, 4, {"COMPLETED": 13, "RUNNING": 1}, running=1))
    short_run = _result(3, 4, started=14, completed=13)
    short_run.version = 2
    assert any("ended at version 2" in p for p in audit(short_run, 3, 4, {"COMPLETED": 13, "RUNNING": 1}, running=1))
    long_run = _result(300, 4, started=1201, completed=1200)
    long_run.history = long_run.history[100:]  # a long run keeps the records of its last 200 steps
    assert audit(long_run, 300, 4, {"COMPLETED": 1200, "RUNNING": 1}, running=1) == []
    failed = audit(_result(3, 4, started=14, completed=12, infra_failed=1), 3, 4, {"COMPLETED": 14}, running=1)
    assert any("infra-failed" in p for p in failed)


def test_bad_workloads_are_refused() -> None:
    from trajflow.lab.bench.soak import SoakWorkload, quick_soak

    with pytest.raises(ValueError, match="levels"):
        ScaleWorkload(levels=(0, 100))
    with pytest.raises(ValueError, match="trace_share"):
        ScaleWorkload(trace_share=0.0)
    with pytest.raises(ValueError, match="0 steps"):
        SoakWorkload(steps=0)
    with pytest.raises(ValueError, match="whole groups"):
        SoakWorkload(batch_size=6, group_size=4)
    assert quick_soak().steps == 60 and quick_soak().history_events == 300
