"""The embedded stack on one machine: Temporal dev server + Web UI, reward service, one worker per pool kind
(and per decode replica: `[pools] decode_replicas`), and a Prometheus scraping them (`trajflow.infra.monitoring`).

`up` starts each as a detached process (logs and a process table under the state dir), placed by the run
config's hardware section (device, torch threads, GPUs and CPUs: `trajflow.infra.placement`), and waits until each is
really ready (the server answers, the reward service is healthy, every queue has a poller); `down` stops
exactly the processes `up` recorded; `status` reports them. When the settings point at a Temporal cluster
(`Settings.temporal_embedded` is false: TLS, an API key or a non-loopback address) no dev server is started: `up`
checks that the cluster answers and knows the project's search attributes, then starts the rest against it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from temporalio.client import Client

from trajflow.contracts import names
from trajflow.contracts.config import RunConfig
from trajflow.infra import monitoring
from trajflow.infra.placement import Placement, placement
from trajflow.infra.ports import port_free
from trajflow.infra.processes import (
    ProcessRecord,
    ProcessTable,
    is_alive,
    kill,
    log_tail,
    python_module,
    restart,
    start_detached,
    stop,
)
from trajflow.infra.settings import Settings
from trajflow.infra.temporal import dev_server_command, ensure_search_attributes, pollers, wait_until_reachable

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Component:
    name: str
    argv: list[str]
    placement: Placement = Placement()
    """Its environment (device, threads, GPUs) and CPUs from the config's hardware section
    (`trajflow.infra.placement`)."""


def _trajflow(*args: str) -> list[str]:
    return python_module("trajflow", *args)


def _pool_args(pools: list[str]) -> list[str]:
    return [a for p in pools for a in ("--pool", p)]


def components(settings: Settings, config: RunConfig, config_path: Path) -> list[Component]:
    cfg = str(config_path.resolve())
    reward_service = python_module(
        "trajflow.rewards.service",
        "--host",
        settings.reward_host,
        "--port",
        str(settings.reward_port),
        "--verifier-timeout-s",
        str(settings.verifier_timeout_s),
    )
    workers = [
        Component("reward-service", reward_service),
        Component("orchestrator", _trajflow("worker", "orchestrator")),
        *decode_components(settings, config, cfg),
        Component("env", _trajflow("worker", "env", *_pool_args(config.pools.env))),
        Component("reward", _trajflow("worker", "reward", *_pool_args(config.pools.reward))),
        Component("trainer", _trajflow("worker", "trainer", "--config", cfg, *_pool_args(config.pools.trainer))),
    ]
    placed = [Component(w.name, w.argv, placement(config, monitoring.component_of(w.name)[0])) for w in workers]
    metrics = monitoring.temporal_metrics_port(settings)
    server = [Component("temporal", dev_server_command(settings, metrics))] if settings.temporal_embedded else []
    return [*server, *placed]


def decode_components(settings: Settings, config: RunConfig, cfg: str) -> list[Component]:
    """The decode workers: `decode` serving every decode pool, and replica `i` (`decode-i`) serving the pools with
    more than `i` replicas (`[pools] decode_replicas`), each its own process with its own engine."""
    most = max(config.pools.replicas(p) for p in config.pools.decode)
    return [
        Component(
            monitoring.replica_name(i),
            _decode_argv(settings, config, cfg, [p for p in config.pools.decode if config.pools.replicas(p) > i]),
        )
        for i in range(most)
    ]


def _decode_argv(settings: Settings, config: RunConfig, cfg: str, pools: list[str]) -> list[str]:
    argv = _trajflow("worker", "decode", "--config", cfg, *_pool_args(pools))
    if config.model.engine != "vllm":
        return argv
    python = settings.resolved_vllm_python
    if not python.exists():
        raise ValueError(
            f"the config asks for the vllm engine, but {python} does not exist: build it with `make vllm-venv` "
            "(or set TRAJFLOW_VLLM_PYTHON)"
        )
    return [str(python), *argv[1:]]


def expected_pollers(config: RunConfig, decode_hosts: dict[str, int] | None = None) -> dict[str, int]:
    """How many workers must poll each decode queue before the stack is ready, where more than one: the pool's
    replicas (`decode_hosts`: under `--hosts`, the number of hosts serving each decode pool)."""
    counts = decode_hosts if decode_hosts is not None else {p: config.pools.replicas(p) for p in config.pools.decode}
    return {names.decode_queue(p): n for p, n in counts.items() if n > 1}


def expected_queues(config: RunConfig) -> list[tuple[str, bool]]:
    """(task queue, is it an activity queue) that must have a poller before the stack is ready."""
    queues = [(names.WORKFLOW_QUEUE, False)]
    queues += [(names.decode_queue(p), True) for p in config.pools.decode]
    queues += [(names.env_queue(p), True) for p in config.pools.env]
    queues += [(names.reward_queue(p), True) for p in config.pools.reward]
    queues += [(names.trainer_queue(p), True) for p in config.pools.trainer]
    return queues


def started_config(records: list[ProcessRecord]) -> Path | None:
    """The run config `trajflow up` started the workers with: the `--config` of its trainer (or decode) worker's
    command line; None when no such worker was started."""
    for rec in sorted(records, key=lambda r: r.name != "trainer"):
        if rec.name in ("trainer", "decode") and "--config" in rec.argv[:-1]:
            return Path(rec.argv[rec.argv.index("--config") + 1])
    return None


def running(settings: Settings) -> list[ProcessRecord]:
    return [r for r in ProcessTable(settings.run_dir).load() if is_alive(r)]


def up(settings: Settings, config: RunConfig, config_path: Path, progress: Progress, timeout_s: float = 600) -> None:
    table = ProcessTable(settings.run_dir)
    alive = {r.name for r in running(settings)}
    monitoring.check_can_start(settings, alive)
    if not settings.temporal_embedded:
        progress(
            f"temporal: using the cluster at {settings.temporal_address} (namespace {settings.temporal_namespace}, "
            f"TLS {'on' if settings.temporal_tls_enabled else 'off'}); no dev server started "
            "(TRAJFLOW_TEMPORAL_DEV_SERVER=true would start one)"
        )
        _register_search_attributes(settings, progress)
    planned = components(settings, config, config_path)
    alive -= stop_surplus_replicas(settings, {c.name for c in planned}, progress)
    for comp in planned:
        if comp.name in alive:
            progress(f"{comp.name}: already running")
            if comp.name == "temporal":
                _register_search_attributes(settings, progress)
            continue
        env = {**comp.placement.env, **monitoring.worker_env(settings, comp.name)}
        rec = start_detached(comp.name, comp.argv, settings.log_dir, env, comp.placement.cpus)
        table.add(rec)
        progress(f"{comp.name}: started (pid {rec.pid}, log {rec.log})")
        if comp.name == "temporal":
            asyncio.run(wait_until_reachable(settings, timeout_s=60))
            progress(
                f"temporal: serving at {settings.temporal_address}, Web UI http://127.0.0.1:{settings.temporal_ui_port}"
            )
        elif comp.name == "reward-service":
            _wait_http(f"{settings.resolved_reward_url}/healthz", rec, timeout_s=60)
            progress(f"reward-service: healthy at {settings.resolved_reward_url}")
    asyncio.run(_wait_for_pollers(settings, config, progress, timeout_s))
    monitoring.start(settings, progress)


def stop_surplus_replicas(settings: Settings, planned: set[str], progress: Progress) -> set[str]:
    """Stop the running decode replicas (`decode-i`) that the config now starting plans no longer has (an `up`
    with fewer `decode_replicas` than the one before); the names stopped."""
    table = ProcessTable(settings.run_dir)
    surplus = [r for r in running(settings) if monitoring.component_of(r.name)[0] == "decode" and r.name not in planned]
    for rec in surplus:
        stop(rec)
        progress(f"{rec.name}: stopped (pid {rec.pid}): the config has fewer decode replicas")
    if surplus:
        table.save([r for r in table.load() if r.name not in {s.name for s in surplus}])
    return {r.name for r in surplus}


def _register_search_attributes(settings: Settings, progress: Progress) -> None:
    """A server that was already running may predate a search attribute (see `ensure_search_attributes`)."""

    async def register() -> list[str]:
        return await ensure_search_attributes(await wait_until_reachable(settings, timeout_s=60))

    added = asyncio.run(register())
    if added:
        progress(f"temporal: registered search attributes {', '.join(added)}")


def down(settings: Settings, progress: Progress) -> int:
    table = ProcessTable(settings.run_dir)
    stopped = 0
    # Workers first, the server last, so workers drain against a live server.
    for rec in reversed(table.load()):
        if stop(rec):
            stopped += 1
            progress(f"{rec.name}: stopped (pid {rec.pid})")
        else:
            progress(f"{rec.name}: was not running")
    table.save([])
    return stopped


def crash_and_restart(settings: Settings, name: str, progress: Progress) -> tuple[ProcessRecord, ProcessRecord]:
    """kill -9 one component of the running stack and start it again with the same command line: what a crash
    and a supervisor's restart do. Returns (the killed record, the new one). Workers reconnect by themselves; a
    caller that restarts the Temporal server waits for it (`wait_until_reachable`)."""
    table = ProcessTable(settings.run_dir)
    old = next((r for r in table.load() if r.name == name), None)
    if old is None or not is_alive(old):
        raise RuntimeError(f"{name} is not running (start the stack with `trajflow up`)")
    kill(old)
    _wait_ports_free(_ports(settings, name), name)
    new = restart(old, settings.log_dir)
    table.replace(new)
    progress(f"{name}: killed -9 (pid {old.pid}), restarted (pid {new.pid})")
    return old, new


def _ports(settings: Settings, name: str) -> list[int]:
    if name == "temporal":
        ui = [settings.temporal_ui_port] if settings.temporal_ui_port else []
        return [int(settings.temporal_address.rpartition(":")[2]), *ui]
    if name == "reward-service":
        return [settings.reward_port]
    return []


def _wait_ports_free(ports: list[int], name: str, timeout_s: float = 30.0) -> None:
    """A killed multi-threaded process is reported gone (its leader a zombie) while its other threads still hold
    its listening sockets for a moment; a restart that binds then fails. Wait until each port binds again."""
    deadline = time.monotonic() + timeout_s
    for port in ports:
        while not port_free(port):
            if time.monotonic() > deadline:
                raise TimeoutError(f"port {port} of {name} still in use {timeout_s:.0f}s after the kill")
            time.sleep(0.1)


def _wait_http(url: str, rec: ProcessRecord, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_alive(rec):
            raise RuntimeError(f"{rec.name} exited; the end of {rec.log}:\n{log_tail(rec)}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{rec.name} not healthy at {url} after {timeout_s:.0f}s; see {rec.log}")


START_RESTARTS = 1
"""How often `up` starts again a worker that exited before it polled: once, so that a transient failure under
load (an engine or a server slow to answer) does not fail the start, while a worker that cannot start fails twice
and is reported with its log."""


def start_up_watch(run_dir: Path, log_dir: Path, progress: Progress) -> Callable[[], None]:
    """A check for the processes of the table at `run_dir` while they start: one that exited is started again
    (`START_RESTARTS` times, the dev server never), and one that exits again raises with the end of its log."""
    processes = ProcessTable(run_dir)
    table = {r.name: r for r in processes.load()}
    restarts = dict.fromkeys(table, 0)

    def exited(rec: ProcessRecord) -> RuntimeError:
        return RuntimeError(f"{rec.name} exited during start-up; the end of {rec.log}:\n{log_tail(rec)}")

    def check() -> None:
        for name, rec in table.items():
            if is_alive(rec):
                continue
            if name == "temporal" or restarts[name] >= START_RESTARTS:
                raise exited(rec)
            restarts[name] += 1
            progress(f"{name}: exited during start-up, starting it again; the end of {rec.log}:\n{log_tail(rec)}")
            try:
                table[name] = restart(rec, log_dir)
            except RuntimeError:  # it exited again at once
                raise exited(rec) from None
            processes.replace(table[name])
            progress(f"{name}: started again (pid {table[name].pid})")

    return check


async def _wait_for_pollers(settings: Settings, config: RunConfig, progress: Progress, timeout_s: float) -> None:
    check_processes = start_up_watch(settings.run_dir, settings.log_dir, progress)
    client = await wait_until_reachable(settings)
    await wait_for_pollers(client, config, progress, time.monotonic() + timeout_s, check_processes, "worker")


async def wait_for_pollers(
    client: Client,
    config: RunConfig,
    progress: Progress,
    deadline: float,
    check: Callable[[], None],
    who: str,
    decode_hosts: dict[str, int] | None = None,
) -> None:
    """Until every queue of `config` has a poller, and each decode queue one per replica: `wait_for_queues` on
    `expected_queues(config)` with `expected_pollers`."""
    counts = expected_pollers(config, decode_hosts)
    await wait_for_queues(client, expected_queues(config), progress, deadline, check, who, counts)


async def wait_for_queues(
    client: Client,
    queues: list[tuple[str, bool]],
    progress: Progress,
    deadline: float,
    check: Callable[[], None],
    who: str,
    counts: dict[str, int] | None = None,
) -> None:
    """Until every (queue, is-activity-queue) has a poller (`counts`: at least that many for the queues it names;
    each queue reported once as ready), calling `check` between rounds (it raises when a process or container that
    should poll has died); a TimeoutError names the queues still without a `who` at the monotonic `deadline`."""
    pending = list(queues)
    wanted = counts or {}
    while pending:
        check()
        still = []
        for queue, activity in pending:
            found = await pollers(client, queue, activity=activity)
            if found >= wanted.get(queue, 1):
                progress(f"ready: {queue}" + (f" ({found} pollers)" if found > 1 else ""))
            else:
                still.append((queue, activity))
        pending = still
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"no {who} polls {[q for q, _ in pending]} after the start-up timeout")
        if pending:
            await asyncio.sleep(0.5)


async def queue_report(settings: Settings, config: RunConfig) -> list[tuple[str, int]]:
    client = await wait_until_reachable(settings, timeout_s=3)
    return [(q, await pollers(client, q, activity=a)) for q, a in expected_queues(config)]
