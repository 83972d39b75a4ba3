"""On a CUDA device (marked `gpu`: skipped where torch sees none), the device choice of `trajflow.rl.devices` against
a real driver, in this process and in child processes given other `CUDA_VISIBLE_DEVICES`, as a host container's worker
is (`trajflow.infra.hosts` passes the host's GPUs to Docker, which renumbers them from 0): `auto` is the GPU, a device
index past what is visible is refused, and a worker whose host was given a GPU but sees none fails at start naming the
host instead of falling back to the CPU. Not covered: Docker's device request itself (no Docker engine on the GPU
machines this was written for); tests/unit/test_gpu_placement.py composes config -> container options -> worker
environment without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trajflow.rl import devices
from trajflow.rl.devices import DeviceUnavailable

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
WORKER_CHECK = (
    "from trajflow.rl.devices import require_gpus, resolve_device, visible_gpus\n"
    "print(visible_gpus(), resolve_device('auto'), flush=True)\n"
    "require_gpus(1, 'gpu-host')\n"
    "print('started', flush=True)\n"
)


def _worker_start(visible_devices: str) -> subprocess.CompletedProcess[str]:
    """A child process's device check as a worker of a host given one GPU runs it, with this CUDA_VISIBLE_DEVICES."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible_devices, "PYTHONPATH": path}
    return subprocess.run([sys.executable, "-c", WORKER_CHECK], env=env, capture_output=True, text=True, timeout=120)


def test_auto_is_the_gpu_and_an_index_past_the_visible_ones_is_refused() -> None:
    visible = devices.visible_gpus()
    assert visible >= 1
    assert devices.resolve_device("auto") == "cuda"
    assert devices.resolve_device(f"cuda:{visible - 1}") == f"cuda:{visible - 1}"
    with pytest.raises(DeviceUnavailable, match=f"sees {visible} GPU"):
        devices.resolve_device(f"cuda:{visible}")
    devices.require_gpus(visible, "this-host")  # sees what it was given: no error


def test_a_worker_sees_its_gpu_from_0_and_one_that_sees_none_fails_naming_its_host() -> None:
    given = _worker_start("0")  # what Docker's device request leaves inside a host container
    assert given.returncode == 0, given.stderr
    assert given.stdout.split() == ["1", "cuda", "started"]
    hidden = _worker_start("")  # a host given a GPU that its worker cannot see
    assert hidden.returncode != 0
    assert hidden.stdout.split() == ["0", "cpu"]  # auto alone would fall back; the check stops the worker first
    assert "host 'gpu-host' was given 1 GPU(s), but this worker sees 0" in hidden.stderr
    assert "CUDA_VISIBLE_DEVICES=''" in hidden.stderr
