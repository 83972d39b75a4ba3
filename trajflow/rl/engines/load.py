"""`load_engine`: build the generation engine a `ModelConfig` asks for (not started), in the precision the
hardware runs natively unless the config forces one (`trajflow.rl.precision`).

`prepare_model` converts or builds the model once (what `trajflow setup` / `up` call) and says which precision
decode will run in. `decode_precision` is that choice on its own, so a trainer can publish weights in the dtype
decode workers on the same kind of host will run (they cast on load anyway, so another host's choice works too).

Devices: `device` is a setting (`auto`, `cpu`, `cuda`, `cuda:N`; `trajflow.infra.settings.Settings.device`), resolved by
`trajflow.rl.devices.resolve_device` (auto: a GPU when one is visible); the dtype is chosen for the device it resolves
to. Limits: vLLM picks its own device, assumed CUDA when torch sees one (`[model.vllm]`'s defaults follow that
guess; the setting is not used). The `openai` engine computes nothing here: its server chose device and precision,
and only the model's tokenizer is read locally.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from trajflow.contracts.config import ModelConfig
from trajflow.rl.devices import resolve_device
from trajflow.rl.engines.base import Engine, WeightSource
from trajflow.rl.engines.hf import HFEngine
from trajflow.rl.precision import Precision, resolve_dtype


def decode_device(model: ModelConfig, device: str = "auto") -> str:
    """The device decoding runs on: the `device` setting resolved for the HF engine (`DeviceUnavailable` when it
    names a GPU that is not visible); vLLM's (CUDA when there is one)."""
    if model.engine == "vllm":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return resolve_device(device)


def decode_precision(model: ModelConfig, device: str = "auto") -> Precision:
    """The dtype decode weights get: `model.dtype`, with "auto" resolved for the device decoding runs on."""
    return resolve_dtype(model.dtype, decode_device(model, device))


def load_engine(
    model: ModelConfig,
    *,
    cache_dir: Path,
    weights: WeightSource | None = None,
    device: str = "auto",
    torch_threads: int | None = None,
    precision: Precision | None = None,
    api_key: str | None = None,
) -> Engine:
    """Resolve `model.name_or_path` (`smollm2`, `tiny`, or a local path) under `cache_dir` and build its engine:
    `hf` on `device` (a setting, resolved here), `vllm` (`model.vllm` resolved for vLLM's device; imports vLLM only
    when started) or `openai` (a client of `model.openai`'s server, sending `api_key`; the model's tokenizer only,
    `weights` unused). `precision` None is `decode_precision(model, device)`; pass the one you computed to log it.
    `weights` None serves the initial model only. `model.chat_template` replaces the tokenizer's template."""
    from trajflow.rl.models import resolve_model, use_chat_template

    engine = _engine(
        model, resolve_model(model.name_or_path, cache_dir), weights, device, torch_threads, precision, api_key
    )
    use_chat_template(engine.tokenizer, model.chat_template)  # prompts are rendered on our side, with this tokenizer
    return engine


def _engine(
    model: ModelConfig,
    path: Path,
    weights: WeightSource | None,
    device: str,
    torch_threads: int | None,
    precision: Precision | None,
    api_key: str | None,
) -> Engine:
    if model.openai is not None:
        from trajflow.rl.engines.openai import OpenAIEngine

        return OpenAIEngine(model.openai, path, api_key=api_key, max_in_flight=model.max_batch)
    chosen = precision or decode_precision(model, device)
    if model.engine == "vllm":
        from trajflow.rl.engines.vllm import VLLMEngine

        return VLLMEngine(
            path,
            weights=weights,
            max_batch=model.max_batch,
            dtype=chosen.dtype,
            config=model.vllm,
            device=decode_device(model, device),
        )
    return HFEngine(
        path,
        max_batch=model.max_batch,
        batch_wait_ms=model.batch_wait_ms,
        device=decode_device(model, device),
        torch_threads=torch_threads,
        dtype=getattr(torch, chosen.dtype),
        weights=weights,
        prefix_cache_bytes=model.prefix_cache_mb * 2**20,
        continuous=model.batching == "continuous",
        interrupt_on_update=model.interrupt_on_update,
        weight_slots=model.weight_slots,
    )


def prepare_model(model: ModelConfig, cache_dir: Path, say: Callable[[str], None], device: str = "auto") -> Path:
    """Resolve (convert or build, once) the config's model under `cache_dir`, and say where it is and which
    precision decode will use on this host's `device` (a setting), and why."""
    from trajflow.rl.models import resolve_model

    started = time.monotonic()
    path = resolve_model(model.name_or_path, cache_dir, progress=say)
    say(f"model {model.name_or_path} ready at {path} ({time.monotonic() - started:.1f}s)")
    if model.openai is not None:
        served = model.openai
        say(f"decode on the server at {served.base_url} ({served.served_model!r}, frozen at v{served.policy_version})")
    else:
        say(f"decode on {decode_device(model, device)}: {decode_precision(model, device).describe()}")
    return path
