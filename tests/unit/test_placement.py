"""What a launcher gives each worker process from the hardware section: device, threads, OpenMP threads, GPUs."""

from __future__ import annotations

from contracts.config import RunConfig
from infra.placement import worker_env


def test_embedded_defaults_give_each_torch_worker_half_the_cores() -> None:
    cfg = RunConfig()
    assert worker_env(cfg, "decode", cpu_count=2) == {"TRAJFLOW_DEVICE": "auto", "TRAJFLOW_THREADS": "1", "OMP_NUM_THREADS": "1"}
    assert worker_env(cfg, "trainer", cpu_count=16)["OMP_NUM_THREADS"] == "8"
    assert worker_env(cfg, "env", cpu_count=16) == {"TRAJFLOW_DEVICE": "auto"}


def test_a_host_gives_its_device_gpus_and_threads() -> None:
    cfg = RunConfig.model_validate(
        {"hardware": {"hosts": [
            {"name": "gpu", "runs": ["trainer"], "device": "cuda:0", "gpus": "1", "cpus": "0-5"},
            {"name": "dec", "runs": ["decode"], "threads": 3, "gpus": ""},
        ]}}
    )
    assert worker_env(cfg, "trainer", cpu_count=8) == {
        "TRAJFLOW_DEVICE": "cuda:0", "TRAJFLOW_THREADS": "3", "OMP_NUM_THREADS": "3", "CUDA_VISIBLE_DEVICES": "1"
    }
    assert worker_env(cfg, "decode", "default", cpu_count=8)["CUDA_VISIBLE_DEVICES"] == ""
    assert worker_env(cfg, "decode", "default", cpu_count=8)["TRAJFLOW_THREADS"] == "3"
