"""The hardware-affinity section: what runs where, rejected clearly when wrong, and thread defaults that never
oversubscribe the CPUs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from trajflow.contracts.config import load_run_config
from trajflow.contracts.hardware import HardwareConfig, parse_cpuset

ROOT = Path(__file__).resolve().parents[2]
DECLARED = {"decode": ["default", "fast"], "env": ["default"], "reward": ["default"], "trainer": ["default"]}


def hw(*hosts: dict) -> HardwareConfig:
    return HardwareConfig.model_validate({"hosts": list(hosts)})


def test_cpusets_parse_like_docker_and_taskset() -> None:
    assert parse_cpuset("0-2,5") == [0, 1, 2, 5]
    assert parse_cpuset("3") == [3]
    with pytest.raises(ValueError, match="backwards"):
        parse_cpuset("4-2")


@pytest.mark.parametrize(
    ("host", "match"),
    [
        ({"name": "a", "runs": ["decod"]}, "unknown entries"),
        ({"name": "a", "runs": ["decode"], "cpus": "0-"}, "cpuset"),
        ({"name": "a", "runs": ["decode"], "device": "gpu"}, "auto, cpu, cuda"),
        ({"name": "A b", "runs": ["decode"]}, "pattern"),
        ({"name": "a", "runs": []}, "at least 1"),
        ({"name": "a", "runs": ["decode"], "gpus": "0,,1"}, "distinct GPU indexes or UUIDs"),
        ({"name": "a", "runs": ["decode"], "gpus": "1,1"}, "distinct GPU indexes or UUIDs"),
        ({"name": "a", "runs": ["decode"], "gpus": "1, 2"}, "distinct GPU indexes or UUIDs"),
        # the host's GPUs are renumbered from 0 where its workers run: gpus "1" is their cuda:0
        ({"name": "a", "runs": ["decode"], "gpus": "1", "device": "cuda:1"}, r"renumbered from 0, as cuda:0..cuda:0"),
        ({"name": "a", "runs": ["decode"], "gpus": "", "device": "cuda"}, "gives it no GPU"),
    ],
)
def test_bad_hosts_are_rejected_with_the_reason(host: dict, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        hw(host)


def test_gpus_name_the_hosts_gpus_and_the_device_counts_them_from_0() -> None:
    two, none, inherit = hw(
        {"name": "a", "runs": ["decode"], "gpus": "2,3", "device": "cuda:1"},
        {"name": "b", "runs": ["trainer"], "gpus": "", "device": "cpu"},
        {"name": "c", "runs": ["env"], "device": "cuda:3"},  # no gpus: whatever it sees, unchecked here
    ).hosts
    assert two.gpu_ids() == ["2", "3"] and none.gpu_ids() == [] and inherit.gpu_ids() is None
    assert hw({"name": "u", "runs": ["decode"], "gpus": "GPU-8932f937-d72c-4106"}).hosts[0].gpu_ids() == [
        "GPU-8932f937-d72c-4106"
    ]


def test_a_pool_runs_on_one_host_only_but_decode_pools_may_have_replicas() -> None:
    with pytest.raises(ValidationError, match="runs on both"):
        hw({"name": "a", "runs": ["env"]}, {"name": "b", "runs": ["env"]})
    replicas = hw({"name": "a", "runs": ["decode"]}, {"name": "b", "runs": ["decode"]})
    assert [replicas.pools_on(h, "decode", DECLARED["decode"]) for h in replicas.hosts] == [DECLARED["decode"]] * 2
    with pytest.raises(ValidationError, match="unique"):
        hw({"name": "a", "runs": ["decode"]}, {"name": "a", "runs": ["env"]})


def test_hosts_name_pools_by_kind_or_one_by_one() -> None:
    cfg = hw({"name": "fast", "runs": ["decode:fast"]}, {"name": "rest", "runs": ["decode", "env", "orchestrator"]})
    fast, rest = cfg.hosts
    assert cfg.host_of("decode", "fast") is fast and cfg.host_of("decode", "default") is rest
    assert cfg.pools_on(rest, "decode", DECLARED["decode"]) == ["default"]
    assert cfg.pools_on(fast, "decode", DECLARED["decode"]) == ["fast"]
    assert cfg.unplaced(DECLARED) == ["reward-service", "reward:default", "trainer:default"]


def test_embedded_defaults_split_the_cores_between_decode_and_trainer() -> None:
    assert HardwareConfig().threads_for(None, 2) == 1
    assert HardwareConfig().threads_for(None, 16) == 8
    assert HardwareConfig().threads_for(None, 1) == 1


def test_disjoint_cpusets_do_not_share_and_explicit_threads_win() -> None:
    cfg = hw(
        {"name": "d", "runs": ["decode"], "cpus": "0-3"},
        {"name": "t", "runs": ["trainer"], "cpus": "4-5"},
        {"name": "both", "runs": ["orchestrator"], "threads": 3},
    )
    d, t, both = cfg.hosts
    assert cfg.threads_for(d, 8) == 4 and cfg.threads_for(t, 8) == 2 and cfg.threads_for(both, 8) == 3
    shared = hw({"name": "gpu", "runs": ["decode", "trainer"]})
    assert shared.threads_for(shared.hosts[0], 16) == 8


def test_a_host_naming_an_undeclared_pool_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[hardware.hosts]]\nname = "x"\nruns = ["decode:big"]\n')
    with pytest.raises(ValueError, match="decode:big"):
        load_run_config(bad)


def test_the_hosts_example_places_everything() -> None:
    cfg = load_run_config(ROOT / "trajflow" / "configs" / "hosts.toml")
    declared = {k: getattr(cfg.pools, k) for k in DECLARED}
    assert cfg.hardware.unplaced(declared) == []
    assert len(cfg.hardware.hosts) >= 4


def _vllm_config(tp: int, *hosts: str) -> str:
    return f'[model]\nengine = "vllm"\n[model.vllm]\ntensor_parallel_size = {tp}\n' + "".join(hosts)


@pytest.mark.parametrize(
    ("host", "said"),
    [
        ('[[hardware.hosts]]\nname = "d"\nruns = ["decode"]\ngpus = "0"\n', "decode host 'd' is given 1 GPU(s)"),
        ('[[hardware.hosts]]\nname = "d"\nruns = ["decode"]\ngpus = ""\n', "decode host 'd' is given 0 GPU(s)"),
        ('[[hardware.hosts]]\nname = "d"\nruns = ["decode"]\ndevice = "cpu"\n', "decode host 'd' runs on the CPU"),
    ],
)
def test_a_tensor_parallel_size_above_a_decode_hosts_gpus_is_refused_at_submission(host: str, said: str) -> None:
    from trajflow.contracts.config import parse_run_config

    with pytest.raises(
        ValueError, match=re.escape(f"tensor_parallel_size = 2 splits the model across 2 GPUs, but {said}")
    ):
        parse_run_config(_vllm_config(2, host), "tp config")


def test_a_tensor_parallel_size_within_the_decode_hosts_gpus_or_unknown_is_accepted() -> None:
    from trajflow.contracts.config import parse_run_config

    fits = '[[hardware.hosts]]\nname = "d"\nruns = ["decode"]\ngpus = "2,3"\n'
    unset = '[[hardware.hosts]]\nname = "e"\nruns = ["decode"]\n'  # gpus unset: the machine's own, unknown here
    other = '[[hardware.hosts]]\nname = "t"\nruns = ["trainer"]\ngpus = "0"\n'  # not a decode host
    vllm = parse_run_config(_vllm_config(2, fits, unset, other), "tp config").model.vllm
    assert vllm is not None and vllm.tensor_parallel_size == 2
    hf = '[model]\nengine = "hf"\n[[hardware.hosts]]\nname = "d"\nruns = ["decode"]\ngpus = "0"\n'
    assert parse_run_config(hf, "hf config").model.engine == "hf"  # no vLLM, no tensor parallelism to fit
