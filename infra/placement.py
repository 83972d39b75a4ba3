"""Placement of one worker process: the `TRAJFLOW_*` and runtime variables its launcher gives it, and the CPUs it
is pinned to, from the run config's hardware-affinity section (`trajflow.contracts.hardware`).

Whoever starts a worker (the embedded stack, `trajflow up --hosts`, a user's own container platform) sets these
variables; the worker reads them through `trajflow.infra.settings` (`device`, `threads`) and never looks at where it
runs. `OMP_NUM_THREADS` is set as well because OpenMP sizes its pool when torch is imported, before the worker could
call `torch.set_num_threads`: a pool of one thread per core in every busy torch process is what oversubscribes a
small machine (threads spin at barriers). `placement` adds the host's cpuset, checked against the CPUs this
process may use, for a launcher that pins processes itself (the embedded stack:
`trajflow.infra.processes.start_detached`).

GPUs: a host's `gpus` are the machine's ids, and become `CUDA_VISIBLE_DEVICES` (`""`: every GPU hidden) of a
worker that runs on that machine (the embedded stack). Inside a container that was given them (`trajflow up --hosts`:
a device request) they are renumbered from 0, so there `gpus_given` makes it the container's own `0..n-1`. A decode
or trainer worker on a host with GPUs (and a device other than `cpu`) also gets `TRAJFLOW_EXPECT_GPUS` (how many)
and `TRAJFLOW_HARDWARE_HOST` (the host's name): it fails at start when it sees fewer
(`trajflow.rl.devices.require_gpus`), so `device = "auto"` never quietly means the CPU.

Limits: pure and torch-free; it pins nothing itself (the embedded launcher does, Docker's `--cpuset-cpus` does for
containers). The embedded stack runs one process per worker kind (and `[pools] decode_replicas` decode processes,
each counted as a torch worker when threads are shared out), so a kind whose pools sit on different hosts takes the
placement of its first pool's host.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from trajflow.contracts.config import RunConfig
from trajflow.contracts.hardware import POOL_KINDS, TORCH_KINDS, HostConfig, parse_cpuset


@dataclass(frozen=True)
class Placement:
    """How to start one worker process: its extra environment and the CPUs to pin it to (None: any)."""

    env: dict[str, str] = field(default_factory=dict)
    cpus: list[int] | None = None


def usable_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity mask: what a container's cpuset or taskset left it)."""
    return set(os.sched_getaffinity(0))


def worker_env(config: RunConfig, kind: str, pool: str | None = None, cpu_count: int | None = None) -> dict[str, str]:
    """The variables for the worker of `kind` (serving `pool`, or the kind's first pool): `TRAJFLOW_DEVICE`,
    and for torch kinds `TRAJFLOW_THREADS` and `OMP_NUM_THREADS`; `CUDA_VISIBLE_DEVICES` where the host sets
    `gpus`, and for torch kinds the GPUs they must see. `cpu_count` None: the CPUs this process may use."""
    host = config.hardware.host_of(kind, pool if pool is not None else _first_pool(config, kind))
    return worker_env_on(config, host, kind, cpu_count)


def worker_env_on(
    config: RunConfig, host: HostConfig | None, kind: str, cpu_count: int | None = None, *, gpus_given: bool = False
) -> dict[str, str]:
    """`worker_env` of the worker of `kind` on `host` (None: the defaults): what a host that runs it passes, since a
    decode pool may run on several hosts, each with its own device and CPUs. `gpus_given`: the worker runs in a
    container that was already given the host's GPUs, which it sees as 0..n-1; `CUDA_VISIBLE_DEVICES` is then those
    ids rather than left unset, so a value the image or platform set cannot leak in, and `gpus = ""` still hides a
    GPU the runtime exposes anyway. False: `gpus` are ids of the machine the worker runs on, taken as they are."""
    hardware = config.hardware
    env = {"TRAJFLOW_DEVICE": host.device if host is not None else "auto"}
    if kind in TORCH_KINDS:
        replicas = max(config.pools.decode_replicas.values(), default=1)
        threads = hardware.threads_for(host, cpu_count or len(usable_cpus()), replicas)
        env["TRAJFLOW_THREADS"] = str(threads)
        env["OMP_NUM_THREADS"] = str(threads)
    gpus = host.gpu_ids() if host is not None else None
    if host is not None and gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(len(gpus))) if gpus_given else gpus)
        if gpus and kind in TORCH_KINDS and host.device != "cpu":  # `cpu` asks for the CPU: nothing to check
            env |= {"TRAJFLOW_EXPECT_GPUS": str(len(gpus)), "TRAJFLOW_HARDWARE_HOST": host.name}
    return env


def placement(config: RunConfig, kind: str, pool: str | None = None) -> Placement:
    """`worker_env` plus the host's cpuset, for a launcher that starts the worker as a process on this machine.
    A cpuset naming CPUs this process may not use is a ValueError (pinning to them would fail in the child)."""
    host = config.hardware.host_of(kind, pool if pool is not None else _first_pool(config, kind))
    cpus = None
    if host is not None and host.cpus:
        cpus = parse_cpuset(host.cpus)
        missing = sorted(set(cpus) - usable_cpus())
        if missing:
            raise ValueError(
                f"host {host.name!r} asks for CPUs {host.cpus}, but CPUs {missing} are not available here "
                f"(this machine lets trajflow use {sorted(usable_cpus())})"
            )
    return Placement(env=worker_env(config, kind, pool), cpus=cpus)


def _first_pool(config: RunConfig, kind: str) -> str | None:
    if kind not in POOL_KINDS:
        return None
    pools: list[str] = getattr(config.pools, kind)
    return pools[0] if pools else None
