"""What a launcher gives each worker process from the hardware section: device, threads, OpenMP threads, GPUs, and
the CPUs the embedded stack pins it to (checked on a real child process)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import wait_for
from trajflow.contracts.config import RunConfig
from trajflow.infra.placement import placement, worker_env
from trajflow.infra.processes import is_alive, restart, start_detached
from trajflow.infra.settings import Settings
from trajflow.infra.stack import components


def test_embedded_defaults_give_each_torch_worker_half_the_cores() -> None:
    cfg = RunConfig()
    assert worker_env(cfg, "decode", cpu_count=2) == {
        "TRAJFLOW_DEVICE": "auto",
        "TRAJFLOW_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }
    assert worker_env(cfg, "trainer", cpu_count=16)["OMP_NUM_THREADS"] == "8"
    assert worker_env(cfg, "env", cpu_count=16) == {"TRAJFLOW_DEVICE": "auto"}


def test_a_host_gives_its_device_gpus_and_threads() -> None:
    cfg = RunConfig.model_validate(
        {
            "hardware": {
                "hosts": [
                    {"name": "gpu", "runs": ["trainer"], "device": "cuda:0", "gpus": "1", "cpus": "0-5"},
                    {"name": "dec", "runs": ["decode"], "threads": 3, "gpus": ""},
                ]
            }
        }
    )
    assert worker_env(cfg, "trainer", cpu_count=8) == {
        "TRAJFLOW_DEVICE": "cuda:0",
        "TRAJFLOW_THREADS": "3",
        "OMP_NUM_THREADS": "3",
        "CUDA_VISIBLE_DEVICES": "1",  # the machine's GPU 1: the embedded stack's workers run on this machine
        "TRAJFLOW_EXPECT_GPUS": "1",  # and fail at start where they see none
        "TRAJFLOW_HARDWARE_HOST": "gpu",
    }
    assert worker_env(cfg, "decode", "default", cpu_count=8)["CUDA_VISIBLE_DEVICES"] == ""  # "": every GPU hidden
    assert "TRAJFLOW_EXPECT_GPUS" not in worker_env(cfg, "decode", "default", cpu_count=8)
    assert worker_env(cfg, "decode", "default", cpu_count=8)["TRAJFLOW_THREADS"] == "3"


def test_placement_pins_to_the_hosts_cpuset_and_refuses_cpus_that_are_not_here() -> None:
    cfg = RunConfig.model_validate({"hardware": {"hosts": [{"name": "dec", "runs": ["decode"], "cpus": "0"}]}})
    placed = placement(cfg, "decode")
    assert placed.cpus == [0] and placed.env["TRAJFLOW_THREADS"] == "1"
    assert placement(cfg, "env").cpus is None
    far = RunConfig.model_validate({"hardware": {"hosts": [{"name": "big", "runs": ["trainer"], "cpus": "4000"}]}})
    with pytest.raises(ValueError, match=r"host 'big' asks for CPUs 4000, but CPUs \[4000\] are not available"):
        placement(far, "trainer")


def test_the_embedded_stack_starts_each_worker_with_its_placement(tmp_path: Path) -> None:
    cfg = RunConfig.model_validate(
        {"hardware": {"hosts": [{"name": "t", "runs": ["trainer"], "cpus": "0", "threads": 1, "gpus": ""}]}}
    )
    comps = {c.name: c for c in components(Settings(state_dir=tmp_path), cfg, tmp_path / "run.toml")}
    assert comps["trainer"].placement.cpus == [0]
    assert comps["trainer"].placement.env["CUDA_VISIBLE_DEVICES"] == ""
    assert comps["decode"].placement.env["TRAJFLOW_DEVICE"] == "auto"
    assert comps["temporal"].placement.env == {}


def test_a_started_process_is_pinned_and_keeps_its_placement_on_restart(tmp_path: Path) -> None:
    probe = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'])"]
    first = start_detached("probe", probe, tmp_path, env={"OMP_NUM_THREADS": "1"}, cpus=[0])
    wait_for(lambda: not is_alive(first), what="the probe to exit")
    again = restart(first, tmp_path)
    wait_for(lambda: not is_alive(again), what="the restarted probe to exit")
    assert Path(first.log).read_text().splitlines() == ["[0] 1", "[0] 1"]


def test_status_finds_the_config_up_started_the_workers_with(tmp_path: Path) -> None:
    from trajflow.infra.processes import ProcessRecord
    from trajflow.infra.stack import started_config

    config_path = tmp_path / "mine.toml"
    records = [
        ProcessRecord(name=c.name, pid=1, start_ticks=1, argv=c.argv, log="l")
        for c in components(Settings(state_dir=tmp_path), RunConfig(), config_path)
    ]
    assert started_config(records) == config_path.resolve()
    assert started_config([r for r in records if r.name not in ("trainer", "decode")]) is None
