"""The metrics catalogue and how a worker serves it: every metric recorded through
`trajflow.observability.metrics.record` on a runtime with a metrics port shows on that port's `/metrics` under its
exposed name, with its labels and bucket bounds; the embedded stack's scrape targets come from its process table. (The
real Prometheus, and scraping a real stack: tests/integration/test_metrics.py.)"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port
from trajflow.contracts import metrics
from trajflow.infra import monitoring
from trajflow.infra.processes import ProcessRecord
from trajflow.infra.settings import Settings
from trajflow.infra.temporal import dev_server_command
from trajflow.observability import prometheus


def test_the_catalogue_names_each_metric_once_with_what_it_needs() -> None:
    names = [m.name for m in metrics.METRICS]
    assert len(names) == len(set(names))
    for m in metrics.METRICS:
        assert re.fullmatch(r"trajflow_[a-z_]+", m.name) and not m.name.endswith("_total"), m.name
        assert (m.buckets is not None) == (m.kind == "histogram"), m.name
        assert m.help and m.emitted_by in {*monitoring.SCRAPED}, m.name
    assert metrics.TRAJECTORIES_FINISHED.exposed == "trajflow_trajectories_finished_total"
    assert metrics.SAMPLE_STALENESS.exposed == "trajflow_sample_staleness"


def test_the_observability_page_lists_every_metric_of_the_catalogue() -> None:
    page = (ROOT / "docs" / "observability.md").read_text()
    rows = set(re.findall(r"^\| `(trajflow_[a-z_]+)` \|", page, re.M))
    assert rows == {m.exposed for m in metrics.METRICS}


def test_a_label_the_catalogue_does_not_declare_is_refused() -> None:
    from temporalio.common import MetricMeter

    from trajflow.observability.metrics import record

    with pytest.raises(ValueError, match="no label"):
        record(MetricMeter.noop, metrics.REWARD_ERRORS, 1, kind="x")


def test_a_worker_runtime_serves_what_was_recorded() -> None:
    """In a fresh process (one runtime per process binds one port)."""
    port = free_port()
    script = textwrap.dedent(f"""
        import time, httpx
        from trajflow.contracts import metrics
        from trajflow.observability.metrics import record, runtime_for
        meter = runtime_for("127.0.0.1:{port}").metric_meter
        record(meter, metrics.TRAJECTORIES_FINISHED, 1, run="r", task="t", status="completed")
        record(meter, metrics.TRAJECTORIES_FINISHED, 2, run="r", task="t", status="completed")
        record(meter, metrics.SAMPLE_STALENESS, 1, run="r")
        record(meter, metrics.SAMPLE_STALENESS, 0, run="r")
        record(meter, metrics.REWARD_SECONDS, 0.3)
        record(meter, metrics.DECODE_TOKENS_PER_S, 12.5)
        # the sweeps record through the meter of their client's runtime (no server needed: a lazy client)
        import asyncio
        from temporalio.client import Client
        from trajflow.observability.metrics import meter_of
        client = asyncio.run(Client.connect("127.0.0.1:1", runtime=runtime_for("127.0.0.1:{port}"), lazy=True))
        record(meter_of(client), metrics.RUN_SWEEP_CANCELLED, 4, run="gone")
        record(meter_of(client), metrics.SANDBOXES_SWEPT, 1, reason="orphan")
        try:
            runtime_for("127.0.0.1:{free_port()}")
        except RuntimeError as e:
            print("second runtime refused:", e)
        time.sleep(0.5)
        print(httpx.get("http://127.0.0.1:{port}/metrics").text)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "second runtime refused: this process already serves its metrics" in text
    assert re.search(
        r'^trajflow_trajectories_finished_total\{[^}]*run="r"[^}]*status="completed"[^}]*\} 3$', text, re.M
    )
    assert re.search(r'^trajflow_sample_staleness_bucket\{[^}]*le="0"[^}]*\} 1$', text, re.M)
    assert re.search(r'^trajflow_sample_staleness_bucket\{[^}]*le="1"[^}]*\} 2$', text, re.M)
    assert re.search(r"^trajflow_sample_staleness_sum\{[^}]*\} 1$", text, re.M)
    assert re.search(r'^trajflow_reward_seconds_bucket\{[^}]*le="0.25"[^}]*\} 0$', text, re.M)
    assert re.search(r'^trajflow_reward_seconds_bucket\{[^}]*le="0.5"[^}]*\} 1$', text, re.M)
    assert re.search(r"^trajflow_decode_tokens_per_second\{[^}]*\} 12.5$", text, re.M)
    assert re.search(r'^trajflow_run_sweep_cancelled_total\{[^}]*run="gone"[^}]*\} 4$', text, re.M)
    assert re.search(r'^trajflow_sandboxes_swept_total\{[^}]*reason="orphan"[^}]*\} 1$', text, re.M)


def record_of(name: str, env: dict[str, str], argv: list[str] | None = None) -> ProcessRecord:
    return ProcessRecord(name=name, pid=1, start_ticks=1, argv=argv or ["x"], log="l", env=env)


def test_the_targets_are_every_process_that_serves_metrics(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    server = dev_server_command(settings, metrics_port=7001)
    assert server[server.index("--metrics-port") + 1] == "7001"
    records = [
        record_of("temporal", {}, server),
        record_of("reward-service", {}),
        record_of("decode", {monitoring.METRICS_PORT_VAR: "7002", "TRAJFLOW_THREADS": "1"}),
        record_of("env", {monitoring.METRICS_PORT_VAR: "7003"}),
    ]
    targets = monitoring.targets(records)
    assert [(t.component, t.address) for t in targets] == [
        ("temporal", "127.0.0.1:7001"), ("decode", "127.0.0.1:7002"), ("env", "127.0.0.1:7003"),
    ]  # fmt: skip
    config = prometheus.write(tmp_path / "prom", targets)
    assert "file_sd_configs" in config.read_text()
    groups = json.loads((tmp_path / "prom" / "targets.json").read_text())
    assert groups[1] == {"targets": ["127.0.0.1:7002"], "labels": {"component": "decode", "replica": "0"}}
    assert monitoring.worker_env(settings, "reward-service") == {}
    assert set(monitoring.worker_env(settings, "decode")) == {monitoring.METRICS_PORT_VAR}
    off = Settings(state_dir=tmp_path, prometheus_port=0)
    assert monitoring.worker_env(off, "decode") == {} and monitoring.temporal_metrics_port(off) is None


def test_a_busy_prometheus_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        settings = Settings(state_dir=tmp_path, prometheus_port=port)
        with pytest.raises(RuntimeError, match=f"port {port} .*TRAJFLOW_PROMETHEUS_PORT"):
            monitoring.check_can_start(settings, running=set())
        monitoring.check_can_start(settings, running={"prometheus"})  # ours already holds it: fine
