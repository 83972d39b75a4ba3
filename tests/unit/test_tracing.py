"""The span files and the timeline read from them, with real OpenTelemetry SDK spans (no Temporal): parents,
order, attributes, where the time went; the OTLP endpoint setting; and OTLP export to a real HTTP receiver."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import set_span_in_context

from trajflow.contracts.traces import attr
from trajflow.infra.settings import Settings
from trajflow.observability.timeline import build, read_spans, render, span_files, trace_of
from trajflow.observability.tracing import JsonLinesExporter, traces_url

ROOT = Path(__file__).resolve().parents[2]


def _write_trace(path: Path, wid: str, step_attributes: dict | None = None) -> None:
    """A trajectory's spans as the workers make them: root, two calls, a run beneath each (explicit times)."""
    provider = TracerProvider(resource=Resource.create({"service.name": "trajflow-test"}))
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))
    tracer = provider.get_tracer("t")
    s = 1_000_000_000
    root = tracer.start_span("trajectory", attributes={attr("workflow_id"): wid, attr("seed"): 3}, start_time=0)
    ctx = set_span_in_context(root)
    gen = tracer.start_span("llm.generate", ctx, attributes={attr("turn"): 0, attr("policy_version"): 2}, start_time=s)
    gctx = set_span_in_context(gen)
    run = tracer.start_span("run llm.generate", gctx, attributes={attr("workflow_id"): wid, attr("attempt"): 1},
                            start_time=s + s // 2)  # fmt: skip
    run.end(end_time=4 * s)
    gen.end(end_time=4 * s + s // 10)
    step_attributes = {attr(k): v for k, v in (step_attributes or {}).items()}
    step = tracer.start_span("env.step", ctx, attributes={attr("turn"): 0, **step_attributes}, start_time=5 * s)
    sctx = set_span_in_context(step)
    srun = tracer.start_span("run env.step", sctx, attributes={attr("workflow_id"): wid}, start_time=5 * s + s // 10)
    srun.end(end_time=6 * s)
    step.end(end_time=6 * s + s // 10)
    root.end(end_time=8 * s)
    provider.shutdown()


def test_a_trace_is_read_back_as_a_tree_with_where_the_time_went(tmp_path: Path) -> None:
    _write_trace(tmp_path / "a.jsonl", "traj-1")
    _write_trace(tmp_path / "b.jsonl", "traj-2")  # another trajectory in another process's file
    t = trace_of("traj-1", tmp_path)
    assert t is not None and t.root is not None
    assert [(r.span.name, r.depth) for r in t.rows] == [
        ("trajectory", 0), ("llm.generate", 1), ("run llm.generate", 2), ("env.step", 1), ("run env.step", 2),
    ]  # fmt: skip
    assert [r.offset_s for r in t.rows] == [0.0, 1.0, 1.5, 5.0, 5.1]
    assert t.total_s == 8.0
    assert t.activity_s == pytest.approx({"llm.generate": 2.5, "env.step": 0.9})
    assert t.orchestration_s == pytest.approx(4.6)
    assert t.root.attributes[attr("seed")] == 3 and t.root.service == "trajflow-test"
    text = "\n".join(render(t))
    assert "llm.generate (turn 0, v2)" in text and "run llm.generate (attempt 1, waited 0.000s)" in text
    assert "orchestration" in text and "57.5%" in text  # 4.6 of 8 s
    assert trace_of("traj-3", tmp_path) is None
    assert json.loads(json.dumps(t.to_json()))["orchestration_s"] == pytest.approx(4.6)


def test_an_agent_programs_time_between_its_calls_is_shown(tmp_path: Path) -> None:
    _write_trace(tmp_path / "a.jsonl", "traj-1", {"agent_call": 2, "agent_seconds": 0.75})
    t = trace_of("traj-1", tmp_path)
    assert t is not None
    text = "\n".join(render(t))
    assert "env.step (turn 0, call 2, program 0.75s)" in text
    assert "the agent program between calls: 0.75 s, 1 call(s)" in text
    _write_trace(tmp_path / "b.jsonl", "traj-2")
    assert "agent program" not in "\n".join(render(trace_of("traj-2", tmp_path)))  # type: ignore[arg-type]


def test_a_running_trajectory_shows_its_finished_activities(tmp_path: Path) -> None:
    _write_trace(tmp_path / "a.jsonl", "traj-1")
    lines = (tmp_path / "a.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "a.jsonl").write_text("".join(line for line in lines if '"name":"trajectory"' not in line))
    t = trace_of("traj-1", tmp_path)
    assert t is not None and t.root is None
    assert {r.span.name for r in t.rows} == {"llm.generate", "run llm.generate", "env.step", "run env.step"}
    assert "still running" in "\n".join(render(t))


def test_a_line_being_written_is_skipped(tmp_path: Path) -> None:
    _write_trace(tmp_path / "a.jsonl", "traj-1")
    with (tmp_path / "a.jsonl").open("a") as f:
        f.write('{"trace_id": "half a line of traj-1')
    assert len(read_spans(span_files(tmp_path), "traj-1")) == 3  # the root and the two runs name it


def test_build_keeps_only_the_trace_asked_for(tmp_path: Path) -> None:
    _write_trace(tmp_path / "a.jsonl", "traj-1")
    spans = read_spans(span_files(tmp_path), "")
    t = build("traj-1", spans[0].trace_id, spans)
    assert len(t.rows) == 5


def test_the_otlp_endpoint_comes_from_trajflow_or_opentelemetrys_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TRAJFLOW_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert Settings().otlp_endpoint is None and Settings().traces is True
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert Settings().otlp_endpoint == "http://collector:4318"
    monkeypatch.setenv("TRAJFLOW_OTLP_ENDPOINT", "http://mine:4318/v1/traces")
    assert Settings().otlp_endpoint == "http://mine:4318/v1/traces"
    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert traces_url("http://mine:4318/v1/traces") == "http://mine:4318/v1/traces"


class _Receiver(BaseHTTPRequestHandler):
    bodies: list[tuple[str, bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Receiver.bodies.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_spans_go_over_otlp_when_an_endpoint_is_set(tmp_path: Path) -> None:
    """A worker process's `configure` with an endpoint exports OTLP/HTTP protobuf (decoded here) and writes no file."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    script = (
        "import opentelemetry.trace as t\n"
        "from pathlib import Path\n"
        "from trajflow.observability import tracing\n"
        f"where = tracing.configure(True, 'http://127.0.0.1:{server.server_port}', Path({str(tmp_path)!r}), 'decode')\n"
        "print(where)\n"
        "with t.get_tracer('x').start_as_current_span('llm.generate', attributes={'trajflow.turn': 2}): pass\n"
        "tracing.flush()\n"
    )
    try:
        out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"http://127.0.0.1:{server.server_port}/v1/traces"
    assert [p for p, _ in _Receiver.bodies] == ["/v1/traces"]
    req = ExportTraceServiceRequest.FromString(_Receiver.bodies[0][1])
    (rs,) = req.resource_spans
    resource = {a.key: a.value.string_value for a in rs.resource.attributes}
    assert resource["service.name"] == "trajflow-decode"
    (span,) = [s for ss in rs.scope_spans for s in ss.spans]
    assert span.name == "llm.generate"
    assert {a.key: a.value.int_value for a in span.attributes} == {"trajflow.turn": 2}
    assert list(tmp_path.iterdir()) == []


def test_tracing_off_makes_nothing(tmp_path: Path) -> None:
    from trajflow.observability.tracing import configure

    assert configure(False, None, tmp_path, "decode") is None
    assert list(tmp_path.iterdir()) == []
