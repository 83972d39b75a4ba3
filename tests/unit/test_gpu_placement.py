"""GPU placement composed as one, without a GPU: a hosts config's `gpus` -> the host container's options (its device
request and environment, `trajflow.infra.hosts`) -> the environment `trajflow worker host` gives each worker inside
(`trajflow.workers.host.host_plan`) -> the worker's settings -> its GPU check and device, with the GPUs it sees
simulated. Then the embedded stack, whose workers run on this machine and keep the machine's GPU ids, and the decode and
trainer workers refusing to start on the CPU where their host was given GPUs."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import torch

from trajflow.contracts.config import ModelConfig, parse_run_config
from trajflow.infra import hosts
from trajflow.infra.placement import placement
from trajflow.infra.settings import Settings, load_settings
from trajflow.rl import devices
from trajflow.rl.devices import DeviceUnavailable
from trajflow.workers import decode, trainer
from trajflow.workers.host import host_plan

CONFIG = """
[[hardware.hosts]]
name = "one"
runs = ["decode"]
gpus = "1"

[[hardware.hosts]]
name = "pair"
runs = ["trainer", "reward"]
gpus = "2,3"
device = "cuda:1"

[[hardware.hosts]]
name = "none"
runs = ["orchestrator", "env", "reward-service"]
gpus = ""
"""


def _settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a process started with exactly these `TRAJFLOW_*` variables loads."""
    for name in [n for n in os.environ if n.startswith("TRAJFLOW_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return load_settings()


@pytest.mark.parametrize(
    ("host_name", "kind", "requested", "inside", "device"),
    [("one", "decode", ["1"], "0", "cuda"), ("pair", "trainer", ["2", "3"], "0,1", "cuda:1")],
)
def test_a_host_container_gets_the_machines_gpus_and_its_workers_count_them_from_0(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    host_name: str,
    kind: str,
    requested: list[str],
    inside: str,
    device: str,
) -> None:
    cfg = parse_run_config(CONFIG, "hosts under test")
    placed = hosts.hosts_of(cfg)
    host = next(h for h in placed if h.name == host_name)
    settings = Settings(state_dir=tmp_path)
    layout = hosts.Layout(
        "tfx", "tfx-net", "img", "172.30.0.1", [h.name for h in placed], "s3://b/s", None, cuda_image="img-cuda"
    )

    # up --hosts: the container is given the machine's GPUs by id, on the worker image with CUDA's torch
    opts = hosts.container_options(settings, layout, host, hosts.host_env(settings, layout, host, placed, CONFIG))
    [request] = opts["device_requests"]
    assert request["DeviceIDs"] == requested and request["Capabilities"] == [["gpu"]]
    assert opts["image"] == "img-cuda"

    # inside it, `trajflow worker host NAME` places each worker on the GPUs the container sees: 0..n-1
    container = _settings_from(opts["environment"], monkeypatch)
    assert container.gpus_given
    worker_cfg = parse_run_config(container.run_config or "", "TRAJFLOW_RUN_CONFIG")
    plan = {
        c.name: c
        for c in host_plan(worker_cfg, host_name, container.reward_port, None, gpus_given=container.gpus_given)
    }
    env = plan[kind].env
    assert env["CUDA_VISIBLE_DEVICES"] == inside
    assert env["TRAJFLOW_EXPECT_GPUS"] == str(len(requested)) and env["TRAJFLOW_HARDWARE_HOST"] == host_name
    if "reward" in plan:  # a worker that computes nothing sees the same GPUs, and is not held to them
        assert plan["reward"].env["CUDA_VISIBLE_DEVICES"] == inside
        assert "TRAJFLOW_EXPECT_GPUS" not in plan["reward"].env

    # the worker (the container's environment plus its own, as run_host starts it) checks, then resolves
    worker = _settings_from(opts["environment"] | env, monkeypatch)
    devices.require_gpus(worker.expect_gpus, worker.hardware_host, visible=len(requested))
    assert devices.resolve_device(worker.device, visible=len(requested)) == device
    with pytest.raises(DeviceUnavailable, match=rf"host '{host_name}' was given {len(requested)} GPU\(s\), but"):
        devices.require_gpus(worker.expect_gpus, worker.hardware_host, visible=0)
    if len(requested) > 1:  # one of the host's GPUs missing is as wrong as all of them
        with pytest.raises(DeviceUnavailable, match="but this worker sees 1"):
            devices.require_gpus(worker.expect_gpus, worker.hardware_host, visible=1)


def test_gpus_empty_means_no_gpu_in_a_container_and_on_this_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = parse_run_config(CONFIG, "hosts under test")
    placed = hosts.hosts_of(cfg)
    host = next(h for h in placed if h.name == "none")
    settings = Settings(state_dir=tmp_path)
    layout = hosts.Layout("tfx", "tfx-net", "img", "172.30.0.1", [h.name for h in placed], "s3://b/s", None)
    opts = hosts.container_options(settings, layout, host, hosts.host_env(settings, layout, host, placed, CONFIG))
    assert "device_requests" not in opts and opts["image"] == "img"  # the CPU build of torch where there is no GPU
    plan = {c.name: c for c in host_plan(cfg, "none", 8799, None, gpus_given=True)}
    assert plan["env"].env["CUDA_VISIBLE_DEVICES"] == ""  # hides a GPU the runtime might expose anyway
    assert placement(cfg, "env").env["CUDA_VISIBLE_DEVICES"] == ""  # the embedded stack: every GPU hidden
    unset = parse_run_config('[[hardware.hosts]]\nname = "any"\nruns = ["decode"]\n', "no gpus")
    assert "CUDA_VISIBLE_DEVICES" not in placement(unset, "decode").env  # None: inherit


def test_hosts_given_gpus_need_the_cuda_worker_image(tmp_path: Path) -> None:
    cfg = parse_run_config(CONFIG, "hosts under test")
    placed = hosts.hosts_of(cfg)
    layout = hosts.Layout("tfx", "tfx-net", "img", "172.30.0.1", [h.name for h in placed], "s3://b/s", None)
    with pytest.raises(ValueError, match="host 'one' is given GPUs \\(1\\), but no CUDA worker image was built"):
        hosts.container_options(Settings(state_dir=tmp_path), layout, placed[0], {})
    # `up` says so before it starts anything (no Docker is asked: none runs in this test)
    settings = Settings(state_dir=tmp_path, store_url="s3://b/s")
    with pytest.raises(ValueError, match="hosts one, pair are given GPUs, but no CUDA worker image was built"):
        hosts.up(settings, cfg, CONFIG, "img", print)
    assert not hosts.layout_file(settings).exists()


def test_the_embedded_stack_keeps_the_machines_gpu_ids_and_the_same_check() -> None:
    cfg = parse_run_config(CONFIG, "hosts under test")
    env = placement(cfg, "trainer").env
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"  # a process on this machine: the machine's ids, renumbered by CUDA
    assert env["TRAJFLOW_EXPECT_GPUS"] == "2" and env["TRAJFLOW_HARDWARE_HOST"] == "pair"
    assert host_plan(cfg, "one", 8799, None)[0].env["CUDA_VISIBLE_DEVICES"] == "1"  # `worker host` on a bare machine
    on_cpu = parse_run_config('[[hardware.hosts]]\nname = "c"\nruns = ["trainer"]\ngpus = "0"\ndevice = "cpu"\n', "cpu")
    env = placement(on_cpu, "trainer").env
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and "TRAJFLOW_EXPECT_GPUS" not in env  # it asked for the CPU


@pytest.mark.parametrize("serve", [decode.serve, trainer.serve], ids=["decode", "trainer"])
async def test_a_worker_whose_host_gpus_are_not_visible_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, serve: Callable[..., Awaitable[object]]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    settings = Settings(state_dir=tmp_path, device="auto", expect_gpus=1, hardware_host="one")
    with pytest.raises(DeviceUnavailable, match="host 'one' was given 1 GPU"):
        await serve(settings, ["default"], ModelConfig(name_or_path="tiny"))
