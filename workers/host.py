"""One host's processes: every worker the run config's hardware section places on host NAME, as child processes.

This is what a container of the worker image runs under `trajflow up --hosts` (`trajflow worker host NAME`): the
host's entry in `[[hardware.hosts]]` (or, for a config that places nothing, the default layout of one host per
worker kind, `HardwareConfig.with_defaults`) says which kinds and pools; each child gets its placement variables
(`trajflow.infra.placement.worker_env_on`: device, threads, GPUs; the container's own GPU ids where its launcher gave it
the host's GPUs, `Settings.gpus_given`, as `trajflow up --hosts` does). The reward service listens on every address of
the host, on `TRAJFLOW_REWARD_PORT`. When any child exits the others are stopped and the host exits with that
child's code, so a container platform sees a dead host as dead (and restarts it); SIGTERM stops every child.

Limits: children are not restarted here (that is the platform's job); the cpuset and memory limit are the
container's, not set here.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from trajflow.contracts.config import RunConfig
from trajflow.contracts.hardware import POOL_KINDS
from trajflow.infra.monitoring import HOST_PORTS, METRICS_PORT_VAR
from trajflow.infra.placement import worker_env_on
from trajflow.infra.processes import python_module

log = logging.getLogger("trajflow.host")


@dataclass(frozen=True)
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]


def declared_pools(config: RunConfig) -> dict[str, list[str]]:
    return {kind: list(getattr(config.pools, kind)) for kind in POOL_KINDS}


def host_plan(
    config: RunConfig,
    host_name: str,
    reward_port: int,
    config_path: Path | None,
    metrics: bool = False,
    gpus_given: bool = False,
) -> list[Child]:
    """The processes of `host_name`; raises ValueError naming the hosts there are when it is not one of them.
    `metrics`: each worker serves `/metrics` on its fixed port (`trajflow.infra.monitoring.HOST_PORTS`). `gpus_given`:
    this runs in a container already given the host's GPUs (`trajflow.infra.placement.worker_env_on`)."""
    config.pools.check_one_process_per_pool("on hosts")
    declared = declared_pools(config)
    hardware = config.hardware.with_defaults(declared)
    host = next((h for h in hardware.hosts if h.name == host_name), None)
    if host is None:
        raise ValueError(f"no host {host_name!r} in the config's layout: {[h.name for h in hardware.hosts]}")
    placed = config.model_copy(update={"hardware": hardware})
    cfg = ["--config", str(config_path)] if config_path is not None else []
    trajflow = python_module("trajflow", "worker")
    children = []
    for kind in host.kinds():
        if kind == "reward-service":
            argv = python_module("trajflow.rewards.service", "--host", "0.0.0.0", "--port", str(reward_port))
            children.append(Child(kind, argv, {}))
        elif kind == "orchestrator":
            children.append(Child(kind, [*trajflow, kind], _metrics_env(kind, metrics)))
        else:
            pools = hardware.pools_on(host, kind, declared[kind])
            if not pools:
                continue
            model_cfg = cfg if kind in ("decode", "trainer") else []
            argv = [*trajflow, kind, *model_cfg, *[a for p in pools for a in ("--pool", p)]]
            children.append(
                Child(
                    kind, argv, worker_env_on(placed, host, kind, gpus_given=gpus_given) | _metrics_env(kind, metrics)
                )
            )
    return children


def _metrics_env(kind: str, metrics: bool) -> dict[str, str]:
    return {METRICS_PORT_VAR: str(HOST_PORTS[kind])} if metrics and kind in HOST_PORTS else {}


def run_host(children: list[Child]) -> int:
    """Start every child; when one exits (or on SIGTERM/SIGINT), stop the rest; return the first one's code."""
    procs = {c.name: subprocess.Popen(c.argv, env={**os.environ, **c.env}) for c in children}
    for child in children:
        log.info("started %s (pid %d): %s", child.name, procs[child.name].pid, " ".join(child.argv[1:]))
    stopping: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    code = 0
    while not stopping:
        ended = [(name, p.returncode) for name, p in procs.items() if p.poll() is not None]
        if ended:
            name, code = ended[0]
            log.error("%s exited with code %s: stopping the host", name, code)
            code = code or 1
            break
        time.sleep(0.2)
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 20
    for p in procs.values():
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return code
