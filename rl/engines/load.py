"""`load_engine`: resolve a model and build its generation engine (not started)."""

from __future__ import annotations

from pathlib import Path

import torch

from rl.engines.base import Engine, WeightSource
from rl.engines.hf import HFEngine


def load_engine(
    name_or_path: str,
    cache_dir: Path,
    *,
    max_batch: int = 32,
    batch_wait_ms: float = 10.0,
    device: str = "cpu",
    torch_threads: int | None = None,
    dtype: torch.dtype | None = None,
    weights: WeightSource | None = None,
    engine: str = "hf",
) -> Engine:
    """Resolve a model name (`smollm2`, `tiny`, or a local path) and build its engine (not started): `hf` or
    `vllm` (imports vLLM only when started)."""
    from rl.models import resolve_model

    path = resolve_model(name_or_path, cache_dir)
    if engine == "vllm":
        from rl.engines.vllm import VLLMEngine

        dtype_name = {None: "auto", torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
        return VLLMEngine(path, weights=weights, max_batch=max_batch, dtype=dtype_name)  # type: ignore[arg-type]
    if engine != "hf":
        raise ValueError(f"unknown engine {engine!r}; expected 'hf' or 'vllm'")
    return HFEngine(
        path,
        max_batch=max_batch,
        batch_wait_ms=batch_wait_ms,
        device=device,
        torch_threads=torch_threads,
        dtype=dtype,
        weights=weights,
    )
