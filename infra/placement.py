"""Placement of one worker process: the `TRAJFLOW_*` and runtime variables its launcher gives it, from the run
config's hardware-affinity section (`contracts.hardware`).

Whoever starts a worker (the embedded stack, `trajflow up --hosts`, a user's own container platform) sets these
variables; the worker reads them through `infra.settings` (`device`, `threads`) and never looks at where it runs.
`OMP_NUM_THREADS` is set as well because OpenMP sizes its pool when torch is imported, before the worker could
call `torch.set_num_threads`: a pool of one thread per core in every busy torch process is what oversubscribes a
small machine (threads spin at barriers). Limits: pure and torch-free; it does not pin CPUs itself (the embedded
launcher and Docker's `--cpuset-cpus` do).
"""

from __future__ import annotations

import os

from contracts.config import RunConfig
from contracts.hardware import TORCH_KINDS


def worker_env(config: RunConfig, kind: str, pool: str | None = None, cpu_count: int | None = None) -> dict[str, str]:
    """The variables for the worker of `kind` (serving `pool`, or the kind's first pool): `TRAJFLOW_DEVICE`,
    and for torch kinds `TRAJFLOW_THREADS` and `OMP_NUM_THREADS`; `CUDA_VISIBLE_DEVICES` where the host sets
    `gpus`."""
    hardware = config.hardware
    host = hardware.host_of(kind, pool)
    env = {"TRAJFLOW_DEVICE": host.device if host is not None else "auto"}
    if kind in TORCH_KINDS:
        threads = hardware.threads_for(host, cpu_count or os.cpu_count() or 1)
        env["TRAJFLOW_THREADS"] = str(threads)
        env["OMP_NUM_THREADS"] = str(threads)
    if host is not None and host.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = host.gpus
    return env
