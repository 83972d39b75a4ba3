"""The Prometheus server of the embedded stack (Debian's `prometheus` binary): its config, the file of scrape
targets (one per worker's `/metrics`, and the Temporal dev server's), its command line, and its HTTP API.

Targets come from a file (`file_sd_configs`) that Prometheus re-reads by itself, so `trajflow up` can add a worker
without restarting it. Each target is labelled with its `component` (decode, env, …, temporal), under `--hosts` its
`host`, and a decode worker with its `replica`, so the series of a pool's decode replicas stay apart.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import httpx

SCRAPE_INTERVAL_S = 5
RETENTION = "15d"


@dataclass(frozen=True)
class Target:
    component: str
    address: str
    """host:port of its `/metrics`."""
    host: str = ""
    """The `trajflow up --hosts` host it runs on (a `host` label); empty on the embedded stack."""
    replica: str = ""
    """Which of its pool's decode workers it is (a `replica` label: `0`, `1`, ... on the embedded stack, the host's
    name under `--hosts`); empty for every other component."""

    def labels(self) -> dict[str, str]:
        """The labels Prometheus attaches to every series scraped from it."""
        extra = {"host": self.host, "replica": self.replica}
        return {"component": self.component, **{k: v for k, v in extra.items() if v}}


def binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        raise RuntimeError(
            "the `prometheus` binary was not found: install Debian's package (`apt-get install prometheus`, which "
            "`make setup` does), or set TRAJFLOW_PROMETHEUS_PORT=0 to run the stack without metrics"
        )
    return found


def config_text(targets_file: Path) -> str:
    """prometheus.yml: scrape every target of `targets_file` every SCRAPE_INTERVAL_S seconds."""
    return (
        "# written by `trajflow up`; the targets are in the file below, which Prometheus re-reads by itself\n"
        "global:\n"
        f"  scrape_interval: {SCRAPE_INTERVAL_S}s\n"
        f"  evaluation_interval: {SCRAPE_INTERVAL_S}s\n"
        "scrape_configs:\n"
        "  - job_name: trajflow\n"
        "    file_sd_configs:\n"
        f"      - files: [{json.dumps(str(targets_file))}]\n"
        f"        refresh_interval: {SCRAPE_INTERVAL_S}s\n"
    )


def write(directory: Path, targets: list[Target]) -> Path:
    """Write the config and the targets under `directory`; returns the config's path."""
    directory.mkdir(parents=True, exist_ok=True)
    targets_file = directory / "targets.json"
    groups = [{"targets": [t.address], "labels": t.labels()} for t in targets]
    tmp = targets_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups, indent=2))
    os.replace(tmp, targets_file)  # Prometheus never reads half a file
    config = directory / "prometheus.yml"
    config.write_text(config_text(targets_file))
    return config


def command(config: Path, data_dir: Path, port: int, host: str = "127.0.0.1") -> list[str]:
    return [
        binary(),
        f"--config.file={config}",
        f"--storage.tsdb.path={data_dir}",
        f"--storage.tsdb.retention.time={RETENTION}",
        f"--web.listen-address={host}:{port}",
        "--log.level=warn",
    ]


def url(port: int, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{port}"


def ready(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/-/ready", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def query(base_url: str, promql: str) -> list[dict]:
    """An instant query through the HTTP API: the result vector (`[{"metric": {...}, "value": [t, "v"]}, …]`)."""
    answer = httpx.get(f"{base_url}/api/v1/query", params={"query": promql}, timeout=10.0)
    answer.raise_for_status()
    body = answer.json()
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus answered {promql!r} with {body}")
    return body["data"]["result"]


def active_targets(base_url: str) -> list[dict]:
    """What Prometheus scrapes now, with each target's health (`up`/`down`) and last error."""
    answer = httpx.get(f"{base_url}/api/v1/targets", params={"state": "active"}, timeout=10.0)
    answer.raise_for_status()
    return answer.json()["data"]["activeTargets"]
