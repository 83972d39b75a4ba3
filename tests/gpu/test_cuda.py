"""On a CUDA device (marked `gpu`: skipped where torch sees none), the HF engine with the tiny model on the GPU, each
greedy completion checked against the argmax of a teacher-forced pass on the GPU:
- one request on a static batch;
- continuous batching: more requests than slots, of different lengths, so finished rows free slots that waiting
  requests take at the next decode step;
- a new policy version loaded in place (`trajflow.rl.weights.apply_weights`) into the model on the GPU: the same
  tensors, now holding the new weights, and the completion generated from them.

Run on a GPU machine by `make test-gpu`, beside SmolLM2's architecture on the engines and the trainer
(test_gpu_smollm2.py, test_gpu_vllm.py) and the device checks (test_gpu_devices.py). Synchronous (each engine runs in
`asyncio.run`), so it needs no pytest-asyncio: a GPU machine's own Python runs it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import pytest
import torch

from trajflow.contracts.engines import PolicyWeights
from trajflow.contracts.records import TurnContext
from trajflow.contracts.trajectory import SamplingParams
from trajflow.rl.chat import append_user
from trajflow.rl.engines.base import Completion
from trajflow.rl.engines.hf import HFEngine
from trajflow.rl.models import build_tiny_model

pytestmark = pytest.mark.gpu

DEVICE = "cuda"


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("gpu") / "tiny")


def test_the_hf_engine_generates_on_the_gpu(tiny_path: Path) -> None:
    engine = HFEngine(tiny_path, max_batch=8, batch_wait_ms=5.0, device=DEVICE)
    _, prompt = append_user(TurnContext(), engine.tokenizer, "Guess the number.", "Play well.")

    async def generate() -> Completion:
        await engine.start()
        try:
            assert next(engine.model.parameters()).device.type == DEVICE
            return await engine.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=8))
        finally:
            await engine.close()

    done = asyncio.run(generate())
    assert len(done.token_ids) == len(done.logprobs) > 0
    assert _teacher_forced(engine.model, prompt, done.token_ids) == done.token_ids


def test_continuous_batching_on_the_gpu(tiny_path: Path) -> None:
    engine = HFEngine(tiny_path, max_batch=3, batch_wait_ms=0.0, device=DEVICE, continuous=True)
    prompts = [engine.tokenizer.encode(f"Guess the number {i}. " * (1 + i % 3)) for i in range(7)]
    lengths = [40, 6, 24, 10, 32, 8, 16]  # 7 requests for 3 slots: the short ones end and free theirs

    async def generate() -> list[Completion]:
        await engine.start()
        try:
            jobs = [SamplingParams(temperature=0.0, max_new_tokens=n) for n in lengths]
            return await asyncio.gather(*(engine.generate(p, j) for p, j in zip(prompts, jobs, strict=True)))
        finally:
            await engine.close()

    done = asyncio.run(generate())
    stats = engine.stats()
    assert stats["requests"] == len(prompts)
    assert 1 < stats["mean_batch_size"] <= 3, stats  # decode steps shared by rows, never more rows than slots
    for prompt, completion, n in zip(prompts, done, lengths, strict=True):
        assert 0 < len(completion.token_ids) == len(completion.logprobs) <= n
        assert _teacher_forced(engine.model, prompt, completion.token_ids) == completion.token_ids


class _Published:
    """A weight source that has published one version of policy "run"."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def latest(self, policy: str) -> PolicyWeights | None:
        return PolicyWeights(policy, 1, self.path)

    def latest_version(self, policy: str) -> int:
        return 1


def test_a_new_version_loads_in_place_on_the_gpu(tiny_path: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    new = AutoModelForCausalLM.from_pretrained(tiny_path)
    with torch.no_grad():
        for parameter in new.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(0)) * 0.5)
    new.save_pretrained(tmp_path / "v1")
    engine = HFEngine(tiny_path, max_batch=4, batch_wait_ms=0.0, device=DEVICE, weights=_Published(tmp_path / "v1"))
    _, prompt = append_user(TurnContext(), engine.tokenizer, "Guess the number.", "Play well.")
    storage: dict[str, int] = {}

    async def generate() -> Completion:
        await engine.start()
        try:
            storage.update({name: p.data_ptr() for name, p in engine.model.named_parameters()})  # version 0's
            return await engine.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=12), "run")
        finally:
            await engine.close()

    done = asyncio.run(generate())
    assert storage
    assert (done.policy_version, engine.stats()["weight_loads"]) == (1, 1)
    reference = cast(torch.nn.Module, new).to(DEVICE).state_dict()  # moved in place: `new` is on the GPU now
    for name, parameter in engine.model.named_parameters():
        assert parameter.device.type == DEVICE and parameter.data_ptr() == storage[name], name  # in place
        torch.testing.assert_close(parameter, reference[name].to(parameter.dtype), msg=name)
    assert _teacher_forced(new, prompt, done.token_ids) == done.token_ids


def _teacher_forced(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> list[int]:
    """The argmax after each position of `prompt + completion` but the last, from one pass on the GPU."""
    ids = torch.tensor([prompt + completion], device=DEVICE)
    with torch.inference_mode():
        return model(ids).logits[0, len(prompt) - 1 : -1].argmax(-1).tolist()
