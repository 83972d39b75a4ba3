"""On CUDA (marked `gpu`: skipped where torch sees no CUDA device; `make test-gpu`): SmolLM2-135M's architecture
with random weights through the project's own engine and trainer, built and driven by the GPU check's functions
(`trajflow.lab.bench.gpu_check`), so the test and `trajflow bench gpu` measure the same thing.

- The HF engine (`trajflow.rl.engines.hf.HFEngine`, in the dtype the decode workers pick on the device) holds the model
  on the GPU and serves 1, 16 and 64 concurrent requests, each round as one batch, twice a batch size: every
  completion has a token and a finite logprob (<= 0) per generated token, at most the tokens asked for. Tokens/s per
  batch size, of its second round (`gpu_check.decode_rounds`), is recorded.
- One trainer step of the default job's shape (trajflow/configs/default.toml's [train]: 16 episodes, its trainer
  settings) on `trajflow.rl.trainer.PolicyTrainer`: the loss and gradient norm are finite, the last
  `train_last_layers` blocks moved and the blocks below them did not. The median of a few more steps is recorded.

Random weights: throughput and step time do not depend on the weights' values, but what the model says does, so
nothing here checks text. Not covered: the vLLM engine (test_gpu_vllm.py), several GPUs, the workers.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.gpu_helpers import checked_rounds
from trajflow.lab.bench import gpu_check

pytestmark = pytest.mark.gpu

BATCHES = [1, 16, 64]
NEW_TOKENS = 64
TIMED_STEPS = 3


def test_the_hf_engine_serves_1_16_and_64_requests_on_the_gpu(
    smollm2_random: Path, gpu_figures: dict[str, dict[str, Any]]
) -> None:
    engine, precision = gpu_check.decode_engine(smollm2_random, "cuda", max(BATCHES))

    async def serve() -> tuple[list, dict[str, float]]:
        await engine.start()
        try:
            assert next(engine.model.parameters()).device.type == "cuda"
            return await gpu_check.decode_rounds(engine, BATCHES, NEW_TOKENS), engine.stats()
        finally:
            await engine.close()

    rounds, stats = asyncio.run(serve())
    rows = checked_rounds(rounds, BATCHES, NEW_TOKENS)
    assert stats["batches"] == 1 + 2 * len(BATCHES), f"a round was split into several batches: {stats}"
    summary = ", ".join(f"batch {row['batch']}: {row['tokens_per_s']:.0f} tok/s" for row in rows)
    gpu_figures["hf_decode"] = {
        "summary": f"{summary} ({precision.dtype}, {NEW_TOKENS} new tokens a request)",
        "dtype": precision.dtype,
        "new_tokens": NEW_TOKENS,
        "batches": rows,
    }


def test_a_trainer_step_of_the_default_shape_on_the_gpu(
    smollm2_random: Path, gpu_figures: dict[str, dict[str, Any]]
) -> None:
    trainer, samples = gpu_check.default_trainer(smollm2_random, "cuda", quick=False)
    batch, config = gpu_check.default_train(quick=False)
    assert trainer.accelerator.device.type == "cuda" and len(samples) == batch
    blocks = trainer.unwrapped_model.model.layers
    k = config.train_last_layers
    trained = [p for block in blocks[len(blocks) - k :] for p in block.parameters()]
    frozen = [p for block in blocks[: len(blocks) - k] for p in block.parameters()]
    before_trained = [p.detach().clone() for p in trained]
    before_frozen = [p.detach().clone() for p in frozen]

    metrics = trainer.train_step(samples)

    assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    assert trainer.version == 1
    assert all(not torch.equal(b, p) for b, p in zip(before_trained, trained, strict=True))
    assert all(torch.equal(b, p) for b, p in zip(before_frozen, frozen, strict=True))
    figures = gpu_check.time_train(trainer, samples, TIMED_STEPS)
    assert figures["loss_finite"] and figures["median_step_s"] > 0
    gpu_figures["trainer_step"] = {
        "summary": f"median {figures['median_step_s']:.3f} s a step (batch {figures['batch']}, micro-batch "
        f"{figures['micro_batch']}, last {figures['train_last_layers']} blocks, {figures['loss']}, "
        f"autocast {figures['autocast']}, {figures['tokens_per_step']} tokens)",
        **figures,
    }
