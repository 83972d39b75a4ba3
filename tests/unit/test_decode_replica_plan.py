"""Decode replicas without a server: the config (`[pools] decode_replicas`, a decode pool on several hosts), the
processes the embedded stack starts for them and how their metrics are labelled, the whole `--hosts` plan of two hosts
carrying one decode pool, the compose file's decode service, and the rule that a replica which missed a publication
never answers a request with older weights (real HF engines on a tiny model, a real local store, no Temporal server).
The running stack with two replicas, one killed mid-run, is tests/integration/test_decode_replicas.py."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from trajflow.activities.decode import DecodeActivities
from trajflow.contracts import names
from trajflow.contracts.config import RunConfig, load_run_config, shipped_configs
from trajflow.contracts.trajectory import GenerateInput, SamplingParams
from trajflow.infra import hosts, monitoring
from trajflow.infra.policies import PolicyStore
from trajflow.infra.processes import ProcessRecord, ProcessTable, is_alive, start_detached, stop
from trajflow.infra.settings import Settings
from trajflow.infra.stack import components, expected_pollers, stop_surplus_replicas
from trajflow.infra.store import LocalStore
from trajflow.observability import prometheus
from trajflow.rl.engines.hf import HFEngine
from trajflow.workers.host import host_plan

ROOT = Path(__file__).resolve().parents[2]
TWO_POOLS = {"decode": ["game", "data"]}
TASKS = [{"name": "g", "pools": {"decode": "game"}}]


def config(**pools: object) -> RunConfig:
    return RunConfig.model_validate({"pools": {**TWO_POOLS, **pools}, "tasks": TASKS})


def test_replicas_are_counted_per_declared_pool_and_bad_counts_say_why() -> None:
    cfg = config(decode_replicas={"game": 3})
    assert cfg.pools.replicas("game") == 3 and cfg.pools.replicas("data") == 1
    with pytest.raises(ValidationError, match=r"decode_replicas names \['nope'\], but \[pools\].decode declares only"):
        config(decode_replicas={"nope": 2})
    for bad in (0, -1, 65):
        with pytest.raises(ValidationError, match=f"decode_replicas of pool 'game' is {bad}: a pool runs 1 to 64"):
            config(decode_replicas={"game": bad})
    for path in shipped_configs().values():  # the shipped configs are unchanged: one decode worker per pool
        loaded = load_run_config(path)
        assert all(loaded.pools.replicas(p) == 1 for p in loaded.pools.decode), path


def test_the_embedded_stack_starts_one_decode_process_per_replica(tmp_path: Path) -> None:
    cfg = config(decode_replicas={"game": 3})
    comps = {c.name: c for c in components(Settings(state_dir=tmp_path), cfg, tmp_path / "run.toml")}
    decode = {n: c for n, c in comps.items() if n.startswith("decode")}
    assert sorted(decode) == ["decode", "decode-1", "decode-2"]
    pools = {n: [c.argv[i + 1] for i, a in enumerate(c.argv) if a == "--pool"] for n, c in decode.items()}
    assert pools == {"decode": ["game", "data"], "decode-1": ["game"], "decode-2": ["game"]}
    # 3 decode replicas and the trainer are torch workers sharing every CPU: none gets more than its share
    cores = len(os.sched_getaffinity(0))
    assert {c.placement.env["TRAJFLOW_THREADS"] for c in decode.values()} == {str(max(1, cores // 4))}
    assert expected_pollers(cfg) == {names.decode_queue("game"): 3}
    single = components(Settings(state_dir=tmp_path), RunConfig(), tmp_path / "run.toml")
    assert [c.name for c in single if c.name.startswith("decode")] == ["decode"]  # no replicas: as before


def test_up_with_fewer_replicas_stops_the_surplus_ones_and_nothing_else(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    table = ProcessTable(settings.run_dir)
    started = {
        n: start_detached(n, ["sleep", "60"], settings.log_dir) for n in ("decode", "decode-1", "decode-2", "env")
    }
    for rec in started.values():
        table.add(rec)
    said: list[str] = []
    try:
        stopped = stop_surplus_replicas(settings, {"decode", "decode-1", "env", "trainer"}, said.append)
        assert stopped == {"decode-2"} and not is_alive(started["decode-2"])
        assert all(is_alive(started[n]) for n in ("decode", "decode-1", "env"))
        assert [r.name for r in table.load()] == ["decode", "decode-1", "env"]
        assert said == [f"decode-2: stopped (pid {started['decode-2'].pid}): the config has fewer decode replicas"]
        assert stop_surplus_replicas(settings, {"decode", "decode-1", "env"}, said.append) == set()  # none left
    finally:
        for rec in started.values():
            stop(rec, timeout_s=5)


def test_each_replica_gets_its_own_metrics_port_and_a_replica_label(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    ports = {name: monitoring.worker_env(settings, name) for name in ("decode", "decode-1", "env")}
    assert len({env[monitoring.METRICS_PORT_VAR] for env in ports.values()}) == 3
    records = [ProcessRecord(name=n, pid=1, start_ticks=1, argv=[], log="l", env=env) for n, env in ports.items()]
    targets = monitoring.targets(records)
    assert [(t.component, t.replica) for t in targets] == [("decode", "0"), ("decode", "1"), ("env", "")]
    prometheus.write(tmp_path / "prom", targets)
    groups = json.loads((tmp_path / "prom" / "targets.json").read_text())
    assert [g["labels"] for g in groups] == [
        {"component": "decode", "replica": "0"}, {"component": "decode", "replica": "1"}, {"component": "env"},
    ]  # fmt: skip


def test_only_decode_pools_run_on_several_hosts() -> None:
    two = [{"name": "d1", "runs": ["decode:game"]}, {"name": "d2", "runs": ["decode:game", "env"]}]
    RunConfig.model_validate({"pools": TWO_POOLS, "tasks": TASKS, "hardware": {"hosts": two}})
    for entry in ("env", "trainer:default", "orchestrator", "reward-service"):
        dup = [{"name": "a", "runs": [entry]}, {"name": "b", "runs": [entry]}]
        with pytest.raises(ValidationError, match="only decode pools run on several hosts"):
            RunConfig.model_validate({"hardware": {"hosts": dup}})


def test_the_hosts_plan_of_two_hosts_carrying_one_decode_pool(tmp_path: Path) -> None:
    """Config -> hosts -> each host's processes, containers, awaited pollers and scrape targets, as `up --hosts` and
    `trajflow worker host` use them."""
    cfg = RunConfig.model_validate(
        {
            "pools": TWO_POOLS,
            "tasks": TASKS,
            "hardware": {
                "hosts": [
                    {"name": "gpu-a", "runs": ["decode:game"], "cpus": "0", "device": "cuda:0"},
                    {"name": "gpu-b", "runs": ["decode:game", "decode:data"], "cpus": "1", "device": "cuda:1"},
                    {"name": "cpu", "runs": ["orchestrator", "env", "reward", "reward-service", "trainer"]},
                ]
            },
        }
    )
    placed = hosts.hosts_of(cfg)
    assert [(h.name, h.runs) for h in placed] == [
        ("gpu-a", ["decode:game"]),
        ("gpu-b", ["decode:game", "decode:data"]),
        ("cpu", ["orchestrator", "env", "reward", "reward-service", "trainer"]),
    ]  # nothing unplaced: no default host is added
    plans = {h.name: {c.name: c for c in host_plan(cfg, h.name, 8799, None, metrics=True)} for h in placed}
    assert {h: sorted(p) for h, p in plans.items()} == {
        "gpu-a": ["decode"], "gpu-b": ["decode"], "cpu": ["env", "orchestrator", "reward", "reward-service", "trainer"],
    }  # fmt: skip
    worker = [sys.executable, "-P", "-m", "trajflow", "worker", "decode"]
    assert plans["gpu-a"]["decode"].argv == [*worker, "--pool", "game"]
    assert plans["gpu-b"]["decode"].argv == [*worker, "--pool", "game", "--pool", "data"]
    assert plans["gpu-a"]["decode"].env["TRAJFLOW_DEVICE"] == "cuda:0"
    assert plans["gpu-b"]["decode"].env["TRAJFLOW_DEVICE"] == "cuda:1"
    assert hosts.decode_hosts(cfg) == {"game": 2, "data": 1}
    assert expected_pollers(cfg, hosts.decode_hosts(cfg)) == {names.decode_queue("game"): 2}

    settings = Settings(state_dir=tmp_path, temporal_address="127.0.0.1:7999", reward_port=8799)
    layout = hosts.Layout("tfx", "tfx-net", "img", "172.30.0.1", [h.name for h in placed], "s3://b/s", None)
    opts = {h.name: hosts.container_options(settings, layout, h, {}) for h in placed}
    assert [(o["name"], o["hostname"], o.get("cpuset_cpus")) for o in opts.values()] == [
        ("tfx-gpu-a", "gpu-a", "0"), ("tfx-gpu-b", "gpu-b", "1"), ("tfx-cpu", "cpu", None),
    ]  # fmt: skip
    assert opts["gpu-a"]["command"] == ["worker", "host", "gpu-a"]

    kinds = {h.name: hosts.scraped_kinds(cfg, h) for h in placed}
    targets = monitoring.host_targets(kinds, lambda host: f"10.0.0.{len(host)}")
    decode = sorted((t.host, t.replica) for t in targets if t.component == "decode")
    assert decode == [("gpu-a", "gpu-a"), ("gpu-b", "gpu-b")]
    assert all(t.replica == "" for t in targets if t.component != "decode")

    many = cfg.model_copy(update={"pools": cfg.pools.model_copy(update={"decode_replicas": {"game": 2}})})
    with pytest.raises(ValueError, match='is for the embedded stack .* name "decode:game" in the runs of several'):
        host_plan(many, "gpu-a", 8799, None)


def test_the_compose_file_scales_the_decode_host() -> None:
    compose = yaml.safe_load((ROOT / "infra" / "compose" / "hosts.yml").read_text())
    decode = compose["services"]["decode"]
    assert decode["deploy"]["replicas"] == "${TRAJFLOW_COMPOSE_DECODE_REPLICAS:-1}"
    # what would stop a second container of the service: a fixed name, a fixed host port, a shared host name
    assert not {"container_name", "ports", "hostname"} & set(decode), sorted(decode)
    assert decode["command"][:3] == ["worker", "host", "decode"]
    shipped = {h.name: h.runs for h in load_run_config(shipped_configs()["hosts"]).hardware.hosts}
    assert shipped["decode"] == ["decode"]  # the host every replica runs


async def test_a_replica_that_missed_a_publication_never_serves_older_weights(tiny_model: Path, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    publisher = PolicyStore(store, tmp_path / "trainer")
    # replica a reads the store's pointer on every request; b caches it for a minute (a slow or partitioned reader)
    replicas = {
        "a": HFEngine(
            tiny_model, max_batch=2, batch_wait_ms=1, weights=PolicyStore(store, tmp_path / "a", pointer_ttl_s=0)
        ),
        "b": HFEngine(
            tiny_model, max_batch=2, batch_wait_ms=1, weights=PolicyStore(store, tmp_path / "b", pointer_ttl_s=60)
        ),
    }
    decoders = {name: DecodeActivities(engine, store, "game", name) for name, engine in replicas.items()}
    for engine in replicas.values():
        await engine.start()
    try:
        env = ActivityEnvironment()
        sampling = SamplingParams(temperature=0.0, max_new_tokens=4)

        def request(turn: int, min_version: int) -> GenerateInput:
            return GenerateInput(
                trajectory_id=f"t{turn}/r", turn=0, context_uri=None, user_message="hello", sampling=sampling,
                policy="run", min_policy_version=min_version,
            )  # fmt: skip

        for turn, name in enumerate(decoders):  # both serve v0 (b caches the pointer at v0)
            first = await env.run(decoders[name].generate, request(turn, 0))
            assert (first.policy_version, first.worker_id) == (0, name)
        shutil.copytree(tiny_model, tmp_path / "v1")
        publisher.publish("run", 1, tmp_path / "v1")

        served = await env.run(decoders["a"].generate, request(2, 1))
        assert (served.policy_version, replicas["a"].version) == (1, 1)
        with pytest.raises(ApplicationError) as behind:  # retried by Temporal, here or on replica a
            await env.run(decoders["b"].generate, request(3, 1))
        assert behind.value.type == names.ERR_POLICY_BEHIND and not behind.value.non_retryable
        assert replicas["b"].version == 0
        fresh = DecodeActivities(
            HFEngine(tiny_model, max_batch=2, batch_wait_ms=1, weights=PolicyStore(store, tmp_path / "c")),
            store,
            "game",
            "c",
        )
        await fresh.engine.start()
        try:  # a replica started after the publication loads v1 itself
            assert (await env.run(fresh.generate, request(4, 1))).policy_version == 1
        finally:
            await fresh.engine.close()
    finally:
        for engine in replicas.values():
            await engine.close()


async def test_a_completion_older_than_the_request_needs_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    """The last guard: whatever an engine says it has, weights older than the request's minimum are never returned."""

    class Lagging(HFEngine):
        def available_version(self, policy: str) -> int:
            return 5

    engine = Lagging(tiny_model, max_batch=1, batch_wait_ms=0)
    await engine.start()
    try:
        inp = GenerateInput(
            trajectory_id="t/r", turn=0, context_uri=None, user_message="hi", policy="run", min_policy_version=5
        )
        with pytest.raises(ApplicationError, match="generated with v0 of 'run', the request needs v5") as refused:
            await ActivityEnvironment().run(DecodeActivities(engine, LocalStore(tmp_path), "p", "w").generate, inp)
        assert refused.value.type == names.ERR_POLICY_BEHIND
    finally:
        await engine.close()
