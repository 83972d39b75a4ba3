"""Where a process's torch compute runs: the device a setting names, resolved against what is visible, and the
process's torch threads.

`resolve_device("auto")` is the first visible GPU when torch sees one, else the CPU; `"cpu"`, `"cuda"` and
`"cuda:N"` are kept, and a CUDA device that is not visible (no GPU, or N beyond the visible count, which is what
`CUDA_VISIBLE_DEVICES` leaves) is a `DeviceUnavailable` error naming what is visible. The setting comes from
`trajflow.infra.settings.Settings.device` (launchers set it from the run config's hardware section,
`trajflow.infra.placement`). `require_gpus` is the check that comes first where a host was given GPUs
(`Settings.expect_gpus`): a worker that sees fewer fails at start naming the host, so `auto` never falls back to the CPU
there. Both take the visible count as an argument (default: torch's), so the choice is tested without a GPU.
`use_device` makes a `cuda:N` the process's current CUDA device, so code that says plain `cuda` (accelerate's
single-process default) lands on it.

`set_threads` applies `Settings.threads` (torch intra-op threads) at a worker's start; None keeps torch's default
(one per core, which oversubscribes cores that another busy torch process shares).

Limits: CUDA and CPU only (no MPS, XPU or other accelerators); a device is checked to be visible, not to have
free memory.
"""

from __future__ import annotations

import os
import re

import torch

_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


class DeviceUnavailable(RuntimeError):
    """The setting names a CUDA device this process cannot see."""


def visible_gpus() -> int:
    """How many CUDA GPUs this process sees (0 without a CUDA build of torch or a driver)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(requested: str, visible: int | None = None) -> str:
    """`auto` -> `cuda` when a GPU is visible, else `cpu`; `cpu`, `cuda`, `cuda:N` are checked and kept.
    `visible`: the GPUs this process sees (None: `visible_gpus()`)."""
    if not _DEVICE.match(requested):
        raise ValueError(f"device {requested!r}: use auto, cpu, cuda or cuda:N")
    if requested == "cpu":
        return "cpu"
    visible = visible_gpus() if visible is None else visible
    if requested == "auto":
        return "cuda" if visible > 0 else "cpu"
    if visible == 0:
        raise DeviceUnavailable(
            f"device {requested!r} was asked for, but torch sees no CUDA GPU ({_torch_build()}); set the device to "
            "auto or cpu, or give this worker a GPU"
        )
    index = int(requested.partition(":")[2] or 0)
    if index >= visible:
        raise DeviceUnavailable(
            f"device {requested!r} was asked for, but this process sees {visible} GPU(s) (cuda:0..cuda:{visible - 1}; "
            "CUDA_VISIBLE_DEVICES renumbers them from 0)"
        )
    return requested


def require_gpus(expected: int | None, host: str | None, visible: int | None = None) -> None:
    """Fail with `DeviceUnavailable`, naming `host` and what this process sees, when it sees fewer than the
    `expected` GPUs its host was given (None or 0: nothing is expected). `visible` None: `visible_gpus()`."""
    if not expected:
        return
    visible = visible_gpus() if visible is None else visible
    if visible >= expected:
        return
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    raise DeviceUnavailable(
        f"host {host or '?'!r} was given {expected} GPU(s), but this worker sees {visible} ({_torch_build()}, "
        f"CUDA_VISIBLE_DEVICES={'unset' if cvd is None else repr(cvd)}); it will not fall back to the CPU: give the "
        "host GPUs it can see (a CUDA build of torch, the NVIDIA container runtime), or drop its gpus"
    )


def _torch_build() -> str:
    return f"torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'}"


def use_device(device: str) -> torch.device:
    """The `torch.device` of a resolved device; a `cuda:N` becomes the current CUDA device as well."""
    chosen = torch.device(device)
    if chosen.type == "cuda" and chosen.index is not None:
        torch.cuda.set_device(chosen)
    return chosen


def describe(device: str) -> str:
    """`cuda:0 (NVIDIA H100 80GB HBM3)` or `cpu (AVX2, 2 threads)`, for a worker's start-up log."""
    if device.startswith("cuda"):
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return f"cpu ({torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads)"


def set_threads(threads: int | None) -> int:
    """Set torch's intra-op threads to `threads` (None: leave torch's default); return the count now in use."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    return torch.get_num_threads()
