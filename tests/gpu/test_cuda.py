"""On a CUDA device (marked `gpu`: skipped where torch sees none): the HF engine loads the tiny model onto the GPU and
generates there, greedy tokens equal to the argmax of a teacher-forced pass on the GPU. Run on a GPU machine by
`make test-gpu`, beside SmolLM2's architecture on the engines and the trainer (test_gpu_smollm2.py, test_gpu_vllm.py).
Synchronous (the engine runs in `asyncio.run`), so it needs no pytest-asyncio: a GPU machine's own Python runs it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from trajflow.contracts.records import TurnContext
from trajflow.contracts.trajectory import SamplingParams
from trajflow.rl.chat import append_user
from trajflow.rl.engines.base import Completion
from trajflow.rl.engines.hf import HFEngine
from trajflow.rl.models import build_tiny_model

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("gpu") / "tiny")


def test_the_hf_engine_generates_on_the_gpu(tiny_path: Path) -> None:
    engine = HFEngine(tiny_path, max_batch=8, batch_wait_ms=5.0, device="cuda")
    _, prompt = append_user(TurnContext(), engine.tokenizer, "Guess the number.", "Play well.")

    async def generate() -> Completion:
        await engine.start()
        try:
            assert next(engine.model.parameters()).device.type == "cuda"
            return await engine.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=8))
        finally:
            await engine.close()

    done = asyncio.run(generate())
    assert len(done.token_ids) == len(done.logprobs) > 0
    ids = torch.tensor([prompt + done.token_ids], device="cuda")
    with torch.inference_mode():
        argmax = engine.model(ids).logits[0, len(prompt) - 1 : -1].argmax(-1).tolist()
    assert argmax == done.token_ids
