"""Where a process's torch compute runs: the device a setting names, resolved against what is visible, and the
process's torch threads.

`resolve_device("auto")` is the first visible GPU when torch sees one, else the CPU; `"cpu"`, `"cuda"` and
`"cuda:N"` are kept, and a CUDA device that is not visible (no GPU, or N beyond the visible count, which is what
`CUDA_VISIBLE_DEVICES` leaves) is a `DeviceUnavailable` error naming what is visible. The setting comes from
`infra.settings.Settings.device` (launchers set it from the run config's hardware section, `infra.placement`).
`use_device` makes a `cuda:N` the process's current CUDA device, so code that says plain `cuda` (accelerate's
single-process default) lands on it.

`set_threads` applies `Settings.threads` (torch intra-op threads) at a worker's start; None keeps torch's default
(one per core, which oversubscribes cores that another busy torch process shares).

Limits: CUDA and CPU only (no MPS, XPU or other accelerators); a device is checked to be visible, not to have
free memory.
"""

from __future__ import annotations

import re

import torch

_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


class DeviceUnavailable(RuntimeError):
    """The setting names a CUDA device this process cannot see."""


def resolve_device(requested: str) -> str:
    """`auto` -> `cuda` when a GPU is visible, else `cpu`; `cpu`, `cuda`, `cuda:N` are checked and kept."""
    if not _DEVICE.match(requested):
        raise ValueError(f"device {requested!r}: use auto, cpu, cuda or cuda:N")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        raise DeviceUnavailable(
            f"device {requested!r} was asked for, but torch sees no CUDA GPU (torch {torch.__version__}, "
            f"CUDA build: {torch.version.cuda or 'none'}); set the device to auto or cpu, or give this worker a GPU"
        )
    index = int(requested.partition(":")[2] or 0)
    visible = torch.cuda.device_count()
    if index >= visible:
        raise DeviceUnavailable(
            f"device {requested!r} was asked for, but this process sees {visible} GPU(s) (cuda:0..cuda:{visible - 1}; "
            "CUDA_VISIBLE_DEVICES renumbers them from 0)"
        )
    return requested


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
