"""`trajflow up --hosts` as a user runs it: four hosts (orchestrator, decode, env, trainer + reward + the reward
service) in containers of the worker image, each with its own network namespace, CPU set and memory limit; the
store on S3 (moto on this machine), Temporal over TCP at the network's gateway. A short training run on the tiny
policy goes on while the env host is `docker kill`ed and `docker start`ed: the run finishes, and its own records
(trajflow.lab.chaos.audit) show no trajectory lost or consumed twice. Then a user env (`py:`) and a dataset task with
its own verifier, submitted from this machine with fresh content (packages no cache holds), run on the env host from
their packages in the S3 store, unpacked there by the worker image's Python. `status` shows the hosts and `down`
removes exactly them.
Also: the compose file of the same layout validates with Debian's docker-compose.

Cold cache cost: the worker image (about 4 min here, once; content-hashed afterwards) and the containers' start.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import docker
import pytest

from tests.conftest import ROOT, free_port, stack_state_dir, wait_for
from trajflow.infra.hosts import S3_KEYS

pytestmark = pytest.mark.integration

CONFIG = """
[model]
name_or_path = "tiny"

[[tasks]]
name = "guess-the-number"
env_id = "game:GuessTheNumber-v0-easy"
max_turns = 2
sampling = { temperature = 1.0, max_new_tokens = 12 }

[train]
steps = 4
batch_size = 8
group_size = 4
redundancy = 0
alpha = 1
trainer = { lr = 1e-4, micro_batch = 8 }

[[hardware.hosts]]
name = "orchestrator"
runs = ["orchestrator"]
memory = "1g"

[[hardware.hosts]]
name = "decode"
runs = ["decode"]
cpus = "0"
memory = "2g"

[[hardware.hosts]]
name = "env"
runs = ["env"]
memory = "1g"

[[hardware.hosts]]
name = "trainer"
runs = ["trainer", "reward", "reward-service"]
cpus = "CPU_LAST"
memory = "2g"
"""


def test_compose_file_validates() -> None:
    assert shutil.which("docker-compose"), "docker-compose is missing: scripts/bootstrap.sh --test installs it"
    env = {**os.environ, "TRAJFLOW_WORKER_IMAGE": "trajflow-worker:test"}
    proc = subprocess.run(
        ["docker-compose", "-f", "infra/compose/hosts.yml", "config", "--services"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()) == ["decode", "env", "orchestrator", "trainer"]
    missing = subprocess.run(
        ["docker-compose", "-f", "infra/compose/hosts.yml", "config"],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "TRAJFLOW_WORKER_IMAGE"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode != 0 and "TRAJFLOW_WORKER_IMAGE" in missing.stderr


@pytest.fixture()
def hosts_stack(cache_dir: Path):
    state_dir = stack_state_dir(cache_dir, "tf-hosts-")
    config = state_dir / "hosts.toml"
    config.write_text(CONFIG.replace("CPU_LAST", str((os.cpu_count() or 2) - 1)))
    prefix = f"tfh{os.getpid()}"
    env = {
        **os.environ,
        "TRAJFLOW_STATE_DIR": str(state_dir),
        "TRAJFLOW_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",
        "TRAJFLOW_TEMPORAL_UI_PORT": str(free_port()),
        "TRAJFLOW_REWARD_PORT": str(free_port()),
        "TRAJFLOW_HOSTS_PREFIX": prefix,
        "TRAJFLOW_HOSTS_S3_PORT": str(free_port()),
        "TRAJFLOW_SANDBOX_WARM_POOL": "1",
        "TRAJFLOW_PROMETHEUS_PORT": str(free_port()),
        "TRAJFLOW_OTLP_ENDPOINT": "",  # spans to the mounted traces directory, whatever the shell says
    }
    trajflow = str(Path(sys.executable).parent / "trajflow")

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([trajflow, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)

    try:
        yield env, state_dir, config, prefix, run
    finally:
        run("down", timeout=180)
        client = docker.from_env()
        for c in client.containers.list(all=True, filters={"label": f"trajflow.hosts={prefix}"}):
            c.remove(force=True)  # only if down failed: what this test started, by its own label
        shutil.rmtree(state_dir, ignore_errors=True)


def test_training_across_four_hosts_survives_a_killed_env_host(hosts_stack, monkeypatch) -> None:
    env, state_dir, config, prefix, run = hosts_stack
    started = time.monotonic()
    up = run("up", "--hosts", "-c", str(config), timeout=900)
    assert up.returncode == 0, f"{up.stdout}\n{up.stderr[-4000:]}"
    up_s = time.monotonic() - started

    client = docker.from_env()
    containers = {
        c.labels["trajflow.host"]: c for c in client.containers.list(filters={"label": f"trajflow.hosts={prefix}"})
    }
    assert sorted(containers) == ["decode", "env", "orchestrator", "trainer"]
    for c in containers.values():
        host_config = c.attrs["HostConfig"]
        assert host_config["NetworkMode"] == f"{prefix}-net" and host_config["PidMode"] == ""  # own namespaces
        assert host_config["Memory"] > 0
    assert containers["decode"].attrs["HostConfig"]["CpusetCpus"] == "0"

    status = run("status", "-c", str(config))
    assert status.returncode == 0, status.stderr
    for host in ("orchestrator", "decode", "env", "trainer"):
        line = next(line for line in status.stdout.splitlines() if line.startswith(f"host {host} "))
        assert "running" in line and "gpus none" in line, status.stdout
        assert f"image {containers[host].attrs['Config']['Image']}" in line and "image trajflow-worker:" in line, line
    assert all(int(line.split()[-1]) >= 1 for line in status.stdout.splitlines() if line.startswith("queue ")), (
        status.stdout
    )

    for key, value in S3_KEYS.items():
        monkeypatch.setenv(key, value)  # this process reads the run's records from the moto store
    report = asyncio.run(_train_killing_env(env, config, prefix, client))
    assert report["counts"]["lost"] == 0, report
    assert report["counts"]["consumed_twice"] == 0, report
    assert report["counts"]["infra_failures_scored"] == 0, report
    assert report["counts"]["steps_completed"] == report["counts"]["steps_configured"] == 4, report
    assert report["killed_sandboxes_reaped"], report
    _metrics_and_traces_of_every_host(env, state_dir, prefix, run)

    # a user env (py:) and a dataset task with its own verifier, submitted from this machine, each from a package no
    # machine has unpacked before (fresh content: a new name in the store and in every cache): the env host fetches it
    # from the S3 store, unpacks it with the worker image's Python (Debian's 3.11.2) and builds the task's layer
    for name, example, source in (
        ("factoring", ROOT / "examples" / "factoring" / "config.toml", "factor_env.py"),
        ("arithmetic", ROOT / "examples" / "arithmetic" / "own_verifier.toml", "sum_check.py"),
    ):
        fresh = fresh_example(example, source, state_dir / "fresh" / name)
        rollout = run("rollout", "-c", str(fresh), "--seed", "3", "--json", timeout=600)
        assert rollout.returncode == 0, rollout.stderr[-4000:]
        done = json.loads(rollout.stdout)
        # the verifier's 1 / 0 / -0.1; the factoring env's 1, or -0.1 per malformed answer of its three attempts
        assert done["status"] == "completed" and -0.31 <= done["reward"] <= 1.0, done
        assert "s3://" in rollout.stderr and "env-packages/" in rollout.stderr, rollout.stderr[-2000:]
        digest = rollout.stderr.split("env-packages/")[1].split(".tar")[0]
        # the env host's image cache is this machine's, mounted (infra.hosts.container_options)
        unpacked = state_dir / "cache" / "images" / "env-packages" / digest
        assert (unpacked / ".trajflow-package").read_text() == digest, f"{name}: not unpacked on the env host"

    down = run("down", timeout=180)
    assert down.returncode == 0 and "stopped 4 host container(s)" in down.stdout, down.stdout + down.stderr
    assert client.containers.list(all=True, filters={"label": f"trajflow.hosts={prefix}"}) == []
    assert client.networks.list(names=[f"{prefix}-net"]) == []
    print(json.dumps({"up_s": round(up_s, 1), **report}))


def fresh_example(config: Path, source: str, into: Path) -> Path:
    """A copy of an example's directory under `into`, with `source` given a unique last line (so its package has a
    name no cache holds) and the model swapped for the stack's tiny one; returns the copied config."""
    shutil.copytree(config.parent, into)
    with open(into / source, "a") as f:
        f.write(f"# fresh package {uuid.uuid4().hex}\n")
    copied = into / config.name
    copied.write_text(copied.read_text().replace('name_or_path = "smollm2"', 'name_or_path = "tiny"'))
    return copied


def _metrics_and_traces_of_every_host(env: dict[str, str], state_dir: Path, prefix: str, run) -> None:
    """The machine's Prometheus scrapes every host's workers at their container's address (the trajectories the
    orchestrator host finished among them), and `trajflow trace` reads spans the containers wrote."""
    from trajflow.observability import prometheus

    base = prometheus.url(int(env["TRAJFLOW_PROMETHEUS_PORT"]))
    expected = {("orchestrator", "orchestrator"), ("decode", "decode"), ("env", "env"), ("trainer", "trainer"),
                ("trainer", "reward")}  # fmt: skip

    def all_up() -> bool:
        up = {(t["labels"].get("host"), t["labels"]["component"]) for t in prometheus.active_targets(base)
              if t["health"] == "up"}  # fmt: skip
        return expected <= up

    wait_for(all_up, 60, 1.0, "every host's workers scraped by the machine's Prometheus")
    mine = docker.from_env().containers.list(filters={"label": f"trajflow.hosts={prefix}"})
    restarts = {c.name: c.attrs["RestartCount"] for c in mine}
    assert restarts[f"{prefix}-orchestrator"] == 0, restarts  # a restart would also restart its counters

    def finished() -> float:
        found = prometheus.query(base, 'sum(trajflow_trajectories_finished_total{host="orchestrator"})')
        return float(found[0]["value"][1]) if found else 0.0

    # the run's last trajectories ended seconds ago: wait for a scrape after them (every 5 s); 4 steps of B = 8
    wait_for(lambda: finished() >= 32, 30, 1.0, "the orchestrator host's finished trajectories in Prometheus")
    assert prometheus.query(base, 'up{component="temporal"}'), "the dev server's own metrics"

    files = sorted(p.name.split("-")[0] for p in (state_dir / "traces").glob("*.jsonl"))
    assert {"orchestrator", "decode", "env", "reward"} <= set(files), files
    line = next(line for p in (state_dir / "traces").glob("orchestrator-*.jsonl") for line in p.read_text().splitlines()
                if '"name":"trajectory"' in line)  # fmt: skip
    wid = json.loads(line)["attributes"]["trajflow.workflow_id"]
    traced = run("trace", wid, "--json")
    assert traced.returncode == 0, traced.stderr
    services = {s["service"] for s in json.loads(traced.stdout)["spans"]}
    assert {"trajflow-orchestrator", "trajflow-decode", "trajflow-env", "trajflow-reward"} <= services, services


async def _train_killing_env(env: dict[str, str], config: Path, prefix: str, docker_client) -> dict:
    """Start the config's training run from this machine, kill -9 the env host's container once trajectories are
    completing, start it again, wait for the run; then audit its records."""
    from trajflow.client import start_training, training_progress
    from trajflow.contracts.config import load_run_config
    from trajflow.infra import hosts
    from trajflow.infra.settings import Settings
    from trajflow.infra.store import open_store
    from trajflow.infra.temporal import connect
    from trajflow.lab.chaos.audit import audit, collect
    from trajflow.sandbox import labels

    settings = Settings(temporal_address=env["TRAJFLOW_TEMPORAL_ADDRESS"])
    client = await connect(settings)
    run = load_run_config(config).training_run()
    handle = await start_training(run, client=client)

    async def completed() -> int:
        return (await training_progress(handle)).counters.completed

    deadline = time.monotonic() + 300
    while await completed() < 2:
        assert time.monotonic() < deadline, "no trajectory completed in 300 s"
        await asyncio.sleep(1)
    env_host = docker_client.containers.get(f"{prefix}-env")
    owner = f"{prefix}-env"
    mine = {"label": [f"{labels.SANDBOX}=1", f"{labels.OWNER_HOST}={owner}"]}
    before = {c.id for c in docker_client.containers.list(all=True, filters=mine, ignore_removed=True)}
    env_host.kill()
    killed_at = time.monotonic()

    def stopped() -> bool:
        env_host.reload()
        return env_host.status != "running"

    await asyncio.to_thread(wait_for, stopped, 30, 0.2, "the killed env host to stop")
    env_host.start()  # what a supervisor (or the restart policy of a crash) does

    def reaped() -> bool:  # the restarted host's reaper removes what the killed one left behind
        return not before & {c.id for c in docker_client.containers.list(all=True, filters=mine, ignore_removed=True)}

    await asyncio.to_thread(wait_for, reaped, 120, 1.0, "the killed env host's sandboxes to be reaped")
    result = await asyncio.wait_for(handle.result(), timeout=900)
    progress = await training_progress(handle)
    store = open_store(
        f"s3://{hosts.BUCKET}/store", s3_endpoint_url=f"http://127.0.0.1:{env['TRAJFLOW_HOSTS_S3_PORT']}"
    )
    query = f"TrajflowRun = '{handle.id}' AND ExecutionStatus = 'Running'"

    async def settled() -> bool:
        return (await client.count_workflows(query)).count == 0

    deadline = time.monotonic() + 120
    while not await settled() and time.monotonic() < deadline:
        await asyncio.sleep(1)
    records = await collect(client, store, handle.id, result.version, run.steps, progress.counters.started)
    counts = audit(records)
    return {
        "counts": counts.model_dump(),
        "sandboxes_of_killed_host": len(before),
        "killed_sandboxes_reaped": True,
        "run_s_after_kill": round(time.monotonic() - killed_at, 1),
    }
