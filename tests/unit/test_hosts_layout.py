"""The hosts layout without Docker: the default hosts, what each host's container gets (addresses over TCP, the S3
store, the config, CPU set, memory, GPUs, the env host's mounts at the same path) and what a host runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trajflow.contracts.config import RunConfig, load_run_config
from trajflow.infra import hosts
from trajflow.infra.monitoring import HOST_PORTS, host_targets
from trajflow.infra.settings import Settings
from trajflow.observability.prometheus import Target
from trajflow.workers.host import host_plan

ROOT = Path(__file__).resolve().parents[2]


def _layout(config: RunConfig) -> hosts.Layout:
    return hosts.Layout(
        prefix="tfx",
        network="tfx-net",
        image="trajflow-worker:abc",
        gateway="172.30.0.1",
        hosts=[h.name for h in hosts.hosts_of(config)],
        store_url="s3://trajflow/store",
        s3_endpoint_url="http://172.30.0.1:8712",
        cuda_image="trajflow-worker-cuda:abc",
    )


def test_a_config_without_hosts_gets_one_host_per_worker_kind() -> None:
    names = [(h.name, h.runs) for h in hosts.hosts_of(load_run_config(ROOT / "trajflow/configs/tiny.toml"))]
    assert names == [
        ("orchestrator", ["orchestrator"]),
        ("reward-service", ["reward-service"]),
        ("decode", ["decode"]),
        ("env", ["env"]),
        ("reward", ["reward"]),
        ("trainer", ["trainer"]),
    ]


def test_placed_hosts_are_kept_and_only_the_rest_added() -> None:
    cfg = RunConfig.model_validate(
        {
            "pools": {"decode": ["a", "b"]},
            "tasks": [{"name": "t", "pools": {"decode": "a"}}],
            "hardware": {"hosts": [{"name": "decode", "runs": ["decode:a"]}]},
        }
    )
    names = [(h.name, h.runs) for h in hosts.hosts_of(cfg)]
    assert ("decode", ["decode:a"]) in names and ("decode-b", ["decode:b"]) in names
    assert [n for n, _ in names].count("decode") == 1


def test_four_host_example_container_options(tmp_path: Path) -> None:
    cfg = load_run_config(ROOT / "trajflow/configs/hosts.toml")
    settings = Settings(state_dir=tmp_path, temporal_address="127.0.0.1:7999", reward_port=8799)
    layout = _layout(cfg)
    placed = hosts.hosts_of(cfg)
    by_name = {h.name: h for h in placed}
    assert sorted(by_name) == ["decode", "env", "orchestrator", "trainer"]

    def options(name: str) -> dict:
        host = by_name[name]
        return hosts.container_options(settings, layout, host, hosts.host_env(settings, layout, host, placed, "x"))

    decode = options("decode")
    assert (
        decode["name"] == "tfx-decode"
        and decode["network"] == "tfx-net"
        and decode["command"] == ["worker", "host", "decode"]
    )
    assert decode["cpuset_cpus"] == "0" and decode["mem_limit"] == "4g"
    traces = str((tmp_path / "traces").resolve())
    assert decode["volumes"] == {traces: {"bind": traces, "mode": "rw"}}  # every host writes its spans here
    env = decode["environment"]
    assert env["TRAJFLOW_TRACE_DIR"] == traces
    assert env["TRAJFLOW_METRICS_HOST"] == "0.0.0.0" and env["TRAJFLOW_PROMETHEUS_PORT"] == "9090"
    assert env["TRAJFLOW_TEMPORAL_ADDRESS"] == "172.30.0.1:7999"  # the gateway, never loopback
    assert env["TRAJFLOW_REWARD_URL"] == "http://tfx-trainer:8799"  # the reward service's host, by name
    assert (
        env["TRAJFLOW_STORE_URL"] == "s3://trajflow/store"
        and env["TRAJFLOW_S3_ENDPOINT_URL"] == "http://172.30.0.1:8712"
    )
    assert env["TRAJFLOW_RUN_CONFIG"] == "x" and env["TRAJFLOW_HOST_NAME"] == "tfx-decode"
    assert decode["labels"] == {hosts.LABEL_HOSTS: "tfx", hosts.LABEL_HOST: "decode"}

    env_opts = options("env")
    state = tmp_path.resolve() / "hosts" / "env"
    assert env_opts["environment"]["TRAJFLOW_STATE_DIR"] == str(state)
    mounts = env_opts["volumes"]
    assert mounts["/var/run/docker.sock"]["bind"] == "/var/run/docker.sock"
    assert mounts[str(state / "sandboxes")]["bind"] == str(state / "sandboxes")  # the same path on both sides
    assert mounts[str((tmp_path / "cache" / "images").resolve())]["bind"] == str(state / "cache" / "images")


def test_gpus_become_a_device_request(tmp_path: Path) -> None:
    cfg = RunConfig.model_validate({"hardware": {"hosts": [{"name": "gpu", "runs": ["trainer"], "gpus": "0,1"}]}})
    host = hosts.hosts_of(cfg)[0]
    opts = hosts.container_options(Settings(state_dir=tmp_path), _layout(cfg), host, {})
    [request] = opts["device_requests"]
    assert request["DeviceIDs"] == ["0", "1"] and request["Capabilities"] == [["gpu"]]
    assert opts["image"] == "trajflow-worker-cuda:abc"


def test_host_plan_runs_each_kind_of_the_host_with_its_placement() -> None:
    cfg = load_run_config(ROOT / "trajflow/configs/hosts.toml")
    plan = {c.name: c for c in host_plan(cfg, "trainer", 8799, None)}
    assert sorted(plan) == ["reward", "reward-service", "trainer"]
    # -P: the working directory stays off sys.path, so a user's own `workflows.py` there shadows nothing
    assert plan["reward-service"].argv[1:] == [
        "-P",
        "-m",
        "trajflow.rewards.service",
        "--host",
        "0.0.0.0",
        "--port",
        "8799",
    ]
    assert plan["trainer"].argv == [sys.executable, "-P", "-m", "trajflow", "worker", "trainer", "--pool", "default"]
    assert plan["trainer"].env["OMP_NUM_THREADS"] == "1"  # cpus = "1": one CPU, one torch worker
    assert plan["reward"].argv[-2:] == ["--pool", "default"]
    with pytest.raises(ValueError, match="no host 'nope'"):
        host_plan(cfg, "nope", 8799, None)
    assert all("TRAJFLOW_METRICS_PORT" not in c.env for c in plan.values())


def test_with_metrics_each_worker_of_a_host_serves_them_on_its_fixed_port() -> None:
    cfg = load_run_config(ROOT / "trajflow/configs/hosts.toml")
    plan = {c.name: c for c in host_plan(cfg, "trainer", 8799, None, metrics=True)}
    assert plan["trainer"].env["TRAJFLOW_METRICS_PORT"] == str(HOST_PORTS["trainer"])
    assert plan["reward"].env["TRAJFLOW_METRICS_PORT"] == str(HOST_PORTS["reward"])
    assert "TRAJFLOW_METRICS_PORT" not in plan["reward-service"].env  # an HTTP app: measured from the reward worker
    orchestrator = host_plan(cfg, "orchestrator", 8799, None, metrics=True)
    assert [c.env for c in orchestrator] == [{"TRAJFLOW_METRICS_PORT": str(HOST_PORTS["orchestrator"])}]

    # the machine's Prometheus scrapes what each host runs, at its container's address, labelled with the host
    kinds = {h.name: hosts.scraped_kinds(cfg, h) for h in hosts.hosts_of(cfg)}
    assert {h: sorted(k) for h, k in kinds.items()} == {
        "orchestrator": ["orchestrator"], "decode": ["decode"], "env": ["env"], "trainer": ["reward", "trainer"],
    }  # fmt: skip
    targets = host_targets(kinds, lambda host: f"10.0.0.{len(host)}")
    assert Target("decode", f"10.0.0.6:{HOST_PORTS['decode']}", "decode", replica="decode") in targets
    assert Target("reward", f"10.0.0.7:{HOST_PORTS['reward']}", "trainer") in targets
    assert len(targets) == 5


def test_a_file_store_is_refused(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, store_url=(tmp_path / "s").as_uri())
    with pytest.raises(ValueError, match="shares no filesystem"):
        hosts.up(settings, RunConfig(), "", "img", print)
