"""Prometheus metrics through the Temporal SDK's runtime: a worker process started with a metrics port serves one
`/metrics` holding the SDK's own (`temporal_*`: polls, task latencies, slots, sticky cache) and trajflow's
(`trajflow.contracts.metrics`), which the code records through the meter of its activity or workflow (`record`).

One runtime per process, made on the first connection (`runtime_for`): the port binds once.
"""

from __future__ import annotations

from temporalio.client import Client
from temporalio.common import MetricMeter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from trajflow.contracts.metrics import METRICS, Metric

_RUNTIMES: dict[str, Runtime] = {}


def runtime_for(bind_address: str) -> Runtime:
    """The process's runtime serving Prometheus metrics at `bind_address` (host:port), made once."""
    if bind_address not in _RUNTIMES:
        if _RUNTIMES:
            raise RuntimeError(f"this process already serves its metrics at {next(iter(_RUNTIMES))}")
        config = PrometheusConfig(
            bind_address=bind_address,
            counters_total_suffix=True,
            durations_as_seconds=True,
            histogram_bucket_overrides={m.name: list(m.buckets) for m in METRICS if m.buckets is not None},
        )
        _RUNTIMES[bind_address] = Runtime(telemetry=TelemetryConfig(metrics=config))
    return _RUNTIMES[bind_address]


def meter_of(client: Client) -> MetricMeter:
    """The meter of the runtime `client` was connected with, for code outside workflows and activities (the
    workers' sweeps): noop when the process serves no metrics."""
    runtime = client.service_client.config.runtime
    return runtime.metric_meter if runtime is not None else MetricMeter.noop


def record(meter: MetricMeter, metric: Metric, value: float, **labels: str) -> None:
    """Add to a counter, observe a histogram or set a gauge of the catalogue. A meter without metrics (a worker
    started without a port, a test's environment) drops it."""
    unknown = set(labels) - set(metric.labels)
    if unknown:
        raise ValueError(f"{metric.name} has no label {sorted(unknown)} (its labels: {list(metric.labels)})")
    attributes = {k: str(v) for k, v in labels.items()}
    if metric.kind == "counter":
        meter.create_counter(metric.name, metric.help).add(int(value), attributes)
    elif metric.kind == "gauge":
        meter.create_gauge_float(metric.name, metric.help).set(float(value), attributes)
    elif counts(metric):
        meter.create_histogram(metric.name, metric.help).record(round(value), attributes)
    else:
        meter.create_histogram_float(metric.name, metric.help).record(float(value), attributes)


def counts(metric: Metric) -> bool:
    """A histogram of whole numbers (its bounds all are): recorded as integers, one instrument kind per name."""
    return (
        metric.kind == "histogram" and metric.buckets is not None and all(float(b).is_integer() for b in metric.buckets)
    )
