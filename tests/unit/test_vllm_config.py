"""`[model.vllm]` without vLLM: the contract (bounds, the section tied to `engine = "vllm"`, one way to size the KV
cache), `engine_args` resolving it for the CPU and a CUDA GPU, `load_engine` handing it to `VLLMEngine` (built, never
started: vLLM is not installed here), and the in-place weight reload's steps against a fake vLLM worker. torch's view
of the GPUs is patched where a GPU is needed; nothing runs on one."""

from __future__ import annotations

import contextlib
import importlib
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from trajflow.contracts.config import ModelConfig, VLLMConfig, parse_run_config
from trajflow.rl.engines.load import load_engine
from trajflow.rl.engines.vllm import VLLMEngine, WorkerExtension, repack_tied_lm_head
from trajflow.rl.engines.vllm_args import CPU_KV_CACHE_GIB, engine_args, ignored

GIB = 2**30


def _gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "device", lambda _device: contextlib.nullcontext())


def _args(config: VLLMConfig, device: str, visible_gpus: int = 0) -> dict[str, Any]:
    return engine_args(config, device, model="/m", dtype="bfloat16", seed=7, max_batch=16, visible_gpus=visible_gpus)


def test_the_section_parses_from_toml_and_belongs_to_the_vllm_engine() -> None:
    text = """
[model]
engine = "vllm"

[model.vllm]
gpu_memory_utilization = 0.8
tensor_parallel_size = 2
max_model_len = 4096
enforce_eager = true
enable_prefix_caching = false
"""
    vllm = parse_run_config(text, "run.toml").model.vllm
    assert vllm == VLLMConfig(
        gpu_memory_utilization=0.8, tensor_parallel_size=2, max_model_len=4096, enforce_eager=True,
        enable_prefix_caching=False,
    )  # fmt: skip
    assert ModelConfig(engine="vllm").vllm is None  # optional: every field at its default
    for engine in ("hf", "openai"):
        with pytest.raises(ValueError, match=rf'\[model.vllm\] is set, but engine = "{engine}"'):
            ModelConfig.model_validate(
                {"engine": engine, "vllm": {}, "openai": {"base_url": "http://h/v1", "served_model": "m"}}
                if engine == "openai"
                else {"engine": engine, "vllm": {}}
            )


@pytest.mark.parametrize(
    "fields",
    [
        {"tensor_parallel_size": 0},
        {"gpu_memory_utilization": 0.0},
        {"gpu_memory_utilization": 1.5},
        {"kv_cache_gib": 0.0},
        {"kv_cache_gib": float("nan")},
        {"max_model_len": 0},
        {"kv_cache_size": 1},  # misspelt: refused, never dropped
    ],
)
def test_out_of_range_or_unknown_fields_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        VLLMConfig.model_validate(fields)


def test_the_kv_cache_is_sized_one_way() -> None:
    with pytest.raises(ValueError, match="both kv_cache_gib and gpu_memory_utilization"):
        VLLMConfig(kv_cache_gib=4.0, gpu_memory_utilization=0.9)  # even at its default value, set is set
    assert VLLMConfig(kv_cache_gib=4.0).gpu_memory_utilization == 0.9


def test_on_the_cpu_the_defaults_are_what_the_engine_always_ran_with() -> None:
    args = _args(VLLMConfig(), "cpu")
    assert args["kv_cache_memory_bytes"] == int(CPU_KV_CACHE_GIB * GIB) == GIB
    assert "gpu_memory_utilization" not in args
    assert args["enforce_eager"] is True
    assert args["tensor_parallel_size"] == 1
    assert args["max_model_len"] is None and args["enable_prefix_caching"] is None  # the model's; vLLM's
    assert (args["model"], args["dtype"], args["seed"], args["max_num_seqs"]) == ("/m", "bfloat16", 7, 16)
    assert args["logprobs_mode"] == "processed_logprobs" and args["generation_config"] == "vllm"
    module, _, name = args["worker_extension_cls"].rpartition(".")
    assert getattr(importlib.import_module(module), name) is WorkerExtension


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_on_a_gpu_the_defaults_are_vllms(device: str) -> None:
    args = _args(VLLMConfig(), device, visible_gpus=2)
    assert args["gpu_memory_utilization"] == 0.9
    assert "kv_cache_memory_bytes" not in args
    assert args["enforce_eager"] is False
    assert args["enable_prefix_caching"] is None


def test_what_a_config_sets_wins_on_either_device() -> None:
    config = VLLMConfig(kv_cache_gib=2.5, enforce_eager=False, enable_prefix_caching=False, max_model_len=512)
    for device in ("cpu", "cuda"):
        args = _args(config, device, visible_gpus=1)
        assert args["kv_cache_memory_bytes"] == int(2.5 * GIB) and "gpu_memory_utilization" not in args
        assert args["enforce_eager"] is False and args["enable_prefix_caching"] is False
        assert args["max_model_len"] == 512
    assert _args(VLLMConfig(enforce_eager=True), "cuda", visible_gpus=1)["enforce_eager"] is True
    assert _args(VLLMConfig(gpu_memory_utilization=0.5), "cuda", visible_gpus=1)["gpu_memory_utilization"] == 0.5


def test_tensor_parallelism_needs_that_many_gpus() -> None:
    assert _args(VLLMConfig(tensor_parallel_size=2), "cuda", visible_gpus=2)["tensor_parallel_size"] == 2
    with pytest.raises(ValueError, match="tensor_parallel_size = 4, but this decode worker sees 2 GPU"):
        _args(VLLMConfig(tensor_parallel_size=4), "cuda", visible_gpus=2)
    with pytest.raises(ValueError, match="tensor_parallel_size = 2 needs CUDA GPUs.*runs on the CPU"):
        _args(VLLMConfig(tensor_parallel_size=2), "cpu", visible_gpus=2)
    with pytest.raises(ValueError, match="CPU or a CUDA GPU, not 'mps'"):
        _args(VLLMConfig(), "mps")


def test_gpu_memory_utilization_set_on_the_cpu_is_ignored_and_said() -> None:
    assert ignored(VLLMConfig(gpu_memory_utilization=0.5), "cpu") == [
        "gpu_memory_utilization is GPU only: on the CPU the KV cache is kv_cache_gib (default 1 GiB)"
    ]
    assert ignored(VLLMConfig(), "cpu") == []  # left at its default: nothing to say
    assert ignored(VLLMConfig(gpu_memory_utilization=0.5), "cuda") == []
    assert "gpu_memory_utilization" not in _args(VLLMConfig(gpu_memory_utilization=0.5), "cpu")


def test_load_engine_hands_the_section_to_the_vllm_engine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _gpus(monkeypatch, 0)
    section = VLLMConfig(gpu_memory_utilization=0.5, max_model_len=64, enable_prefix_caching=False)
    with caplog.at_level(logging.WARNING, logger="trajflow.rl.engines.vllm"):
        engine = load_engine(ModelConfig(name_or_path="tiny", engine="vllm", vllm=section), cache_dir=tmp_path)
    assert isinstance(engine, VLLMEngine) and engine.device == "cpu"
    assert engine.args["kv_cache_memory_bytes"] == GIB and engine.args["enforce_eager"] is True
    assert engine.args["enable_prefix_caching"] is False
    assert engine.args["max_model_len"] == 64 == engine.max_positions  # the context budget follows it
    assert "[model.vllm] ignored on cpu: gpu_memory_utilization is GPU only" in caplog.text

    _gpus(monkeypatch, 2)
    model = ModelConfig(name_or_path="tiny", engine="vllm", vllm=VLLMConfig(tensor_parallel_size=2))
    engine = load_engine(model, cache_dir=tmp_path, device="cpu")  # vLLM's device is its build's, not the setting
    assert isinstance(engine, VLLMEngine) and engine.device == "cuda"
    assert engine.args["gpu_memory_utilization"] == 0.9 and engine.args["enforce_eager"] is False
    assert engine.args["tensor_parallel_size"] == 2 and engine.args["dtype"] == "bfloat16"
    no_section = load_engine(ModelConfig(name_or_path="tiny", engine="vllm"), cache_dir=tmp_path)
    assert isinstance(no_section, VLLMEngine)
    assert no_section.args == {**engine.args, "tensor_parallel_size": 1, "seed": no_section.seed}
    with pytest.raises(ValueError, match="tensor_parallel_size = 4, but this decode worker sees 2 GPU"):
        load_engine(ModelConfig(name_or_path="tiny", engine="vllm", vllm=VLLMConfig(tensor_parallel_size=4)),
                    cache_dir=tmp_path)  # fmt: skip


class _Method:
    def __init__(self) -> None:
        self.processed: list[object] = []

    def process_weights_after_loading(self, layer: object) -> None:
        self.processed.append(layer)


def test_a_tied_lm_head_is_repacked_and_nothing_else() -> None:
    method = _Method()
    head = SimpleNamespace(quant_method=method)
    model = SimpleNamespace(lm_head=head)
    assert repack_tied_lm_head(model, SimpleNamespace(tie_word_embeddings=True)) is True
    assert method.processed == [head]
    assert repack_tied_lm_head(model, SimpleNamespace(tie_word_embeddings=False)) is False
    assert repack_tied_lm_head(model, SimpleNamespace()) is False  # a config without the attribute: untied
    assert repack_tied_lm_head(SimpleNamespace(), SimpleNamespace(tie_word_embeddings=True)) is False
    assert repack_tied_lm_head(SimpleNamespace(lm_head=object()), SimpleNamespace(tie_word_embeddings=True)) is False
    assert method.processed == [head]


class _FakeWorker(WorkerExtension):
    """What the reload touches of vLLM's worker (the same attributes on its CPU and GPU workers)."""

    def __init__(self, tied: bool) -> None:
        self.method = _Method()
        self.model = SimpleNamespace(lm_head=SimpleNamespace(quant_method=self.method))
        self.model_runner = SimpleNamespace(get_model=lambda: self.model)
        text_config = SimpleNamespace(tie_word_embeddings=tied)
        self.vllm_config = SimpleNamespace(model_config=SimpleNamespace(hf_text_config=text_config))
        self.reloads: list[dict[str, Any]] = []

    def reload_weights(self, **kwargs: Any) -> None:
        self.reloads.append(kwargs)


@pytest.mark.parametrize("tied", [True, False])
def test_the_worker_reloads_the_checkpoint_then_repacks_a_tied_head(tied: bool) -> None:
    worker = _FakeWorker(tied)
    worker.trajflow_reload_weights("/store/policies/run/v3")
    assert worker.reloads == [{"weights_path": "/store/policies/run/v3", "is_checkpoint_format": True}]
    assert worker.method.processed == ([worker.model.lm_head] if tied else [])
