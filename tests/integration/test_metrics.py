"""Prometheus as `trajflow up` starts it, scraping every worker: after a short training run (the smoke config,
async, with two of its sandbox containers killed mid-episode), Prometheus's HTTP API holds each of trajflow's
metrics with the value the run's own records give (Temporal visibility, the run's summary), and every worker's
and the dev server's target is up with the SDK's own metrics beside ours."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, free_port, wait_for
from trajflow.contracts import metrics, names
from trajflow.contracts.trajectory import TrajectoryProgress
from trajflow.infra.monitoring import SCRAPED
from trajflow.observability import prometheus

pytestmark = pytest.mark.integration
RUN = "metrics-run"


def value(url: str, promql: str) -> float:
    """The single value of an instant query (0 when there is no series: a counter never incremented)."""
    result = prometheus.query(url, promql)
    assert len(result) <= 1, f"{promql} gave {len(result)} series: {result}"
    return float(result[0]["value"][1]) if result else 0.0


def scraped_since(url: str, t: float) -> bool:
    """Whether Prometheus has scraped every target after wall time `t` (each target is scraped on its own clock)."""
    from datetime import datetime

    return all(datetime.fromisoformat(x["lastScrape"]).timestamp() > t for x in prometheus.active_targets(url))


def worker_totals(url: str, now: str) -> dict[str, float]:
    """The worker-level totals over the stack's current targets only (`now`: an instance selector). Prometheus keeps
    the last samples of processes an earlier `trajflow down` stopped (no staleness marker is written on its own
    shutdown) for 5 minutes, and those would drop out of a sum between two reads."""
    queries = {
        "resets": f"sum({metrics.SANDBOX_RESET_SECONDS.name}_count{{{now}}})",
        "takes": f"sum({metrics.WARM_POOL_TAKES.exposed}{{{now}}})",
        "rewards": f"sum({metrics.REWARD_SECONDS.name}_count{{{now}}})",
        "reward_errors": f"sum({metrics.REWARD_ERRORS.exposed}{{{now}}})",
        "tokens": f"sum({metrics.DECODE_TOKENS.exposed}{{{now}}})",
        "requests": f"sum({metrics.DECODE_BATCH_REQUESTS.name}_count{{{now}}})",
        "waits": f"sum({metrics.DECODE_QUEUE_WAIT_SECONDS.name}_count{{{now}}})",
        "env_failures": f'sum({metrics.ENV_FAILURES.exposed}{{{now},type!="{names.ERR_ENV}"}})',
        "env_recoveries": f"sum({metrics.ENV_RECOVERIES.exposed}{{{now}}})",
    }
    return {k: value(url, q) for k, q in queries.items()}


async def kill_sandboxes(client, want: int, done: asyncio.Event) -> int:
    """Kill the containers of `want` running episodes of the run once each has a sandbox (as `trajflow chaos` does)."""
    import docker

    from trajflow.sandbox.labels import SANDBOX_ID

    engine = docker.from_env()
    killed: set[str] = set()
    query = f"WorkflowType = '{names.TRAJECTORY_WORKFLOW}' AND {names.SA_RUN} = '{RUN}' AND ExecutionStatus = 'Running'"
    while len(killed) < want and not done.is_set():
        async for wf in client.list_workflows(query):
            if wf.id in killed or len(killed) >= want:
                continue
            try:
                p = await client.get_workflow_handle(wf.id).query(names.QUERY_PROGRESS, result_type=TrajectoryProgress)
            except Exception:
                continue
            if p.sandbox and p.turn == 0:  # killed before its first step: that step finds it gone
                found = engine.containers.list(filters={"label": f"{SANDBOX_ID}={p.sandbox}"})
                for container in found:
                    container.kill()
                    killed.add(wf.id)
        await asyncio.sleep(0.2)
    return len(killed)


async def test_prometheus_sees_a_training_run_as_the_run_counts_it(cli_stack, tmp_path: Path) -> None:
    url = prometheus.url(int(cli_stack.env["TRAJFLOW_PROMETHEUS_PORT"]))
    assert prometheus.ready(url)
    active = prometheus.active_targets(url)
    assert {t["labels"]["component"] for t in active} == {*SCRAPED, "temporal"}, "`up` waits for every target"
    now = 'instance=~"{}"'.format("|".join(t["labels"]["instance"] for t in active))
    wait_for(
        lambda: all(t["health"] == "up" for t in prometheus.active_targets(url)), timeout_s=30, what="every target up"
    )
    t = time.time()
    wait_for(lambda: scraped_since(url, t), timeout_s=30, what="a scrape of every target")
    before = worker_totals(url, now)

    config = tmp_path / "metrics-smoke.toml"  # no redundant samples: every trajectory started is one the run counts
    smoke = (ROOT / "trajflow" / "configs" / "smoke.toml").read_text()
    config.write_text(smoke.replace("redundancy = 1", "redundancy = 0").replace("max_turns = 2", "max_turns = 4"))
    out = tmp_path / "summary.json"
    client = await cli_stack.connect()
    done = asyncio.Event()
    killer = asyncio.create_task(kill_sandboxes(client, 2, done))
    train = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "trajflow"), "train", str(config), "--run-id", RUN, "--no-eval",
        "--json-summary", str(out), cwd=ROOT, env=cli_stack.env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(train.communicate(), timeout=600)
    done.set()
    killed = await killer
    assert train.returncode == 0, stderr.decode()[-3000:]
    summary = json.loads(out.read_text())

    # the run's own records: every trajectory of the run in visibility, once none is still running
    rows: list[dict] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        listed = cli_stack.trajflow("trajectories", "list", "--run", RUN, "--json", "--limit", "1000")
        rows = json.loads(listed.stdout)["trajectories"]
        if rows and all(r["status"] != "running" for r in rows):
            break
        await asyncio.sleep(1)
    by_status = {s: sum(r["status"] == s for r in rows) for s in ("completed", "failed", "infra_failed")}
    recovered = sum(r["env_failures"] or 0 for r in rows)

    t = time.time()  # every trajectory of the run has ended: what the workers counted is in the next scrape of each
    while not scraped_since(url, t):
        assert time.time() < t + 30, "Prometheus scrapes every 5 s"
        await asyncio.sleep(0.5)
    staleness = f'{metrics.SAMPLE_STALENESS.name}_count{{run="{RUN}"}}'
    for status, n in by_status.items():
        assert value(url, f'sum({metrics.TRAJECTORIES_FINISHED.exposed}{{run="{RUN}",status="{status}"}})') == n, status
    assert by_status["completed"] >= summary["trajectories_trained"] == 24
    assert value(url, staleness) == summary["trajectories_trained"]
    lags = sum(int(lag) * n for lag, n in summary["staleness_histogram"].items())
    assert value(url, f'{metrics.SAMPLE_STALENESS.name}_sum{{run="{RUN}"}}') == lags
    within_alpha = f'{metrics.SAMPLE_STALENESS.name}_bucket{{run="{RUN}",le="1"}}'
    assert value(url, within_alpha) == summary["trajectories_trained"]  # alpha = 1
    assert value(url, f'{metrics.TRAIN_STEP_SECONDS.name}_count{{run="{RUN}"}}') == summary["steps"] == 3
    assert value(url, f'{metrics.TRAIN_STEP_SECONDS.name}_sum{{run="{RUN}"}}') > 0

    after = worker_totals(url, now)
    delta = {k: after[k] - before[k] for k in after}
    scored = by_status["completed"]
    started = len(rows)
    # resets: one per trajectory that got a sandbox, plus one per recovery; every one a warm hit or a start
    assert scored + recovered <= delta["resets"] == delta["takes"] <= started + recovered, (delta, started)
    # a call per attempt: one that answered for each scored trajectory, and each that failed (retried or final)
    assert delta["rewards"] == scored + delta["reward_errors"], delta
    turns = sum(r["turns"] or 0 for r in rows if r["status"] == "completed")
    assert turns <= delta["requests"] == delta["waits"], delta  # one batch size and one queue wait per request
    assert delta["tokens"] >= turns, delta  # at least one token a turn
    assert value(url, f"max({metrics.DECODE_TOKENS_PER_S.name}{{{now}}})") > 0
    # the killed sandboxes: each failure the run recovered from, counted by type, as the trajectories say
    assert killed == 2 and recovered >= 1, (killed, rows)
    assert delta["env_failures"] == delta["env_recoveries"] == recovered, delta
    assert value(url, f'sum({metrics.ENV_RECOVERIES.exposed}{{{now},type="{names.ERR_SANDBOX_LOST}"}})') >= 1

    # the SDK's own metrics from every worker, and the dev server's
    for component in (*SCRAPED, "temporal"):
        assert value(url, f'up{{{now},component="{component}"}}') == 1, component
    sdk = prometheus.query(url, f'count by (component) ({{__name__=~"temporal_.+",{now}}})')
    assert {r["metric"]["component"] for r in sdk} >= set(SCRAPED), sdk


def test_prometheus_answers_queries_through_its_http_api(tmp_path: Path) -> None:
    """The real binary on a config with no targets but itself: ready, and `up` for its own job."""
    port = free_port()
    config = prometheus.write(tmp_path, [prometheus.Target("prometheus", f"127.0.0.1:{port}")])
    proc = subprocess.Popen(prometheus.command(config, tmp_path / "data", port), stderr=subprocess.PIPE)
    try:
        url = prometheus.url(port)
        wait_for(lambda: prometheus.ready(url), timeout_s=60, what="prometheus ready")
        wait_for(lambda: prometheus.query(url, 'up{component="prometheus"}') != [], timeout_s=30, what="a scrape")
        assert prometheus.query(url, 'up{component="prometheus"}')[0]["value"][1] == "1"
        assert [t["health"] for t in prometheus.active_targets(url)] == ["up"]
        with pytest.raises(httpx.HTTPStatusError):
            prometheus.query(url, "sum(")  # a bad query is an error, not an empty answer
    finally:
        proc.terminate()
        proc.wait(timeout=30)
