"""The stack's Prometheus: a `/metrics` port for each worker (and the Temporal dev server), the scrape targets
(read back from the process table; with `--hosts`, each host container's address and the fixed ports its workers
serve on), and the Prometheus process itself, which `trajflow up` starts last and `trajflow down` stops first. The
decode replicas of the embedded stack (`decode`, `decode-1`, ...) are one `component="decode"` with a `replica` label.
`TRAJFLOW_PROMETHEUS_PORT=0` turns all of it off.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from trajflow.infra.ports import free_port, port_free
from trajflow.infra.processes import ProcessRecord, ProcessTable, is_alive, log_tail, start_detached
from trajflow.infra.settings import Settings
from trajflow.observability import prometheus
from trajflow.observability.prometheus import Target

METRICS_PORT_VAR = "TRAJFLOW_METRICS_PORT"
SCRAPED = ("orchestrator", "decode", "env", "reward", "trainer")
"""The worker processes that serve `/metrics` (the reward service is an HTTP app, measured from the reward worker)."""


def enabled(settings: Settings) -> bool:
    return settings.prometheus_port != 0


def check_can_start(settings: Settings, running: set[str]) -> None:
    """Before `up` starts anything: the binary is there and the port is free (unless ours already holds it)."""
    if not enabled(settings) or "prometheus" in running:
        return
    prometheus.binary()
    if not port_free(settings.prometheus_port):
        raise RuntimeError(
            f"port {settings.prometheus_port} (Prometheus) is in use: another Prometheus (Debian's service starts "
            "one there: `systemctl stop prometheus`) or another stack; set TRAJFLOW_PROMETHEUS_PORT to a free port, "
            "or to 0 to run without metrics"
        )


DECODE = "decode"


def replica_name(replica: int) -> str:
    """The process name of the embedded stack's decode worker number `replica`: `decode`, `decode-1`, ..."""
    return DECODE if replica == 0 else f"{DECODE}-{replica}"


def component_of(name: str) -> tuple[str, str]:
    """(component, replica) of a recorded process name: `decode-1` -> `("decode", "1")`, `decode` -> `("decode",
    "0")`, anything else -> `(name, "")`."""
    found = re.fullmatch(rf"{DECODE}(?:-(\d+))?", name)
    return (DECODE, found.group(1) or "0") if found else (name, "")


def worker_env(settings: Settings, name: str) -> dict[str, str]:
    """The variables giving worker `name` (a decode replica's too) its own `/metrics` port (none when metrics are
    off)."""
    if not enabled(settings) or component_of(name)[0] not in SCRAPED:
        return {}
    return {METRICS_PORT_VAR: str(free_port())}


HOST_PORTS = {"orchestrator": 9101, "decode": 9102, "env": 9103, "reward": 9104, "trainer": 9105}
"""The `/metrics` port of each worker inside a `--hosts` container (its own network namespace: fixed ports)."""


def host_container_env(settings: Settings) -> dict[str, str]:
    """What a host container needs to serve its workers' metrics to the machine's Prometheus (or not to)."""
    return {"TRAJFLOW_PROMETHEUS_PORT": str(settings.prometheus_port), "TRAJFLOW_METRICS_HOST": "0.0.0.0"}


def host_targets(kinds_by_host: dict[str, list[str]], address_of: Callable[[str], str]) -> list[Target]:
    """The workers of each host (`kinds_by_host`: the worker kinds each runs) at its container's address; a decode
    worker's `replica` is its host (several hosts may serve one decode pool)."""
    return [
        Target(kind, f"{address_of(host)}:{HOST_PORTS[kind]}", host, host if kind == DECODE else "")
        for host, kinds in kinds_by_host.items()
        for kind in kinds
        if kind in HOST_PORTS
    ]


def temporal_metrics_port(settings: Settings) -> int | None:
    if not enabled(settings):
        return None
    return settings.temporal_metrics_port or free_port()


def targets(records: list[ProcessRecord]) -> list[Target]:
    """Every recorded process that serves metrics: a worker by its variable, the dev server by its flag."""
    out = []
    for rec in records:
        port = rec.env.get(METRICS_PORT_VAR)
        if port is None and rec.name == "temporal" and "--metrics-port" in rec.argv:
            port = rec.argv[rec.argv.index("--metrics-port") + 1]
        if port is not None:
            component, replica = component_of(rec.name)
            out.append(Target(component, f"127.0.0.1:{port}", replica=replica))
    return out


def start(
    settings: Settings, progress: Callable[[str], None], timeout_s: float = 60.0, extra: list[Target] | None = None
) -> None:
    """Write the targets of every recorded process (and `extra`: the hosts' workers) and start Prometheus (when it
    is not running already: it re-reads the targets file by itself), then wait until it scrapes them all."""
    if not enabled(settings):
        return
    table = ProcessTable(settings.run_dir)
    records = table.load()
    directory = settings.state_dir / "prometheus"
    scraped = targets(records) + list(extra or [])
    config = prometheus.write(directory, scraped)
    url = prometheus.url(settings.prometheus_port)
    current = next((r for r in records if r.name == "prometheus" and is_alive(r)), None)
    if current is None:
        argv = prometheus.command(config, directory / "data", settings.prometheus_port)
        current = start_detached("prometheus", argv, settings.log_dir)
        table.add(current)
        progress(f"prometheus: started (pid {current.pid}, log {current.log})")
    deadline = time.monotonic() + timeout_s
    while not prometheus.ready(url):
        if not is_alive(current):
            raise RuntimeError(f"prometheus exited; the end of {current.log}:\n{log_tail(current)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"prometheus not ready at {url} after {timeout_s:.0f}s; see {current.log}")
        time.sleep(0.2)
    wanted = {t.address for t in scraped}
    while {t["scrapeUrl"].split("/")[2] for t in prometheus.active_targets(url)} != wanted:
        if time.monotonic() > deadline:  # it re-reads the targets file by itself; say so rather than wait on
            progress(f"prometheus: {url} has not picked up all of {sorted(wanted)} yet (it will, from {directory})")
            return
        time.sleep(0.5)
    progress(f"prometheus: {url} scraping {len(scraped)} targets ({', '.join(t.component for t in scraped)})")
