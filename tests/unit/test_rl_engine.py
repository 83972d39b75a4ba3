"""trajflow.rl.engines: HFEngine batches concurrent requests, respects its budget, reports honest logprobs, handles
cancellation; ScriptedEngine replays text. All on the tiny random model (float32, CPU)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch

from trajflow.contracts.config import ModelConfig
from trajflow.contracts.records import TurnContext
from trajflow.contracts.trajectory import SamplingParams
from trajflow.rl.chat import append_completion, append_user
from trajflow.rl.engines.base import Completion, Engine
from trajflow.rl.engines.hf import HFEngine
from trajflow.rl.engines.load import load_engine
from trajflow.rl.engines.scripted import ScriptedEngine
from trajflow.rl.models import build_tiny_model
from trajflow.rl.precision import CpuInfo, choose_precision, resolve_dtype

LOGPROB_TOL = 1e-4
"""float32 on CPU: a left-padded batched decode with a KV cache and one unpadded teacher-forced forward pass
sum in different orders; observed differences are ~1e-6, so 1e-4 is a safe margin that still catches any
off-by-one or temperature mistake (those are off by > 1e-2)."""


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("rl-engine") / "tiny")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engine(tiny_path: Path) -> AsyncIterator[HFEngine]:
    eng = HFEngine(tiny_path, max_batch=32, batch_wait_ms=20.0)
    await eng.start()
    yield eng
    await eng.close()


def _prompts(tokenizer: Any, n: int) -> list[list[int]]:
    prompts = []
    for i in range(n):
        _, ids = append_user(TurnContext(), tokenizer, f"Guess the number {i}. " * (1 + i % 3), "Play well.")
        prompts.append(ids)
    return prompts


def _teacher_forced(model: Any, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    ids = torch.tensor([prompt + completion])
    with torch.inference_mode():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    t = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / t, dim=-1).gather(1, torch.tensor(completion)[:, None]).squeeze(1).tolist()


def _check_finish(engine: HFEngine, c: Completion, max_new: int) -> None:
    assert 1 <= len(c.token_ids) <= max_new
    assert len(c.logprobs) == len(c.token_ids)
    eos = engine.tokenizer.eos_token_id
    assert eos not in c.token_ids[:-1]
    if c.finish_reason == "stop":
        assert c.token_ids[-1] == eos
    else:
        assert c.finish_reason == "length" and len(c.token_ids) == max_new and c.token_ids[-1] != eos


async def test_concurrent_requests_are_batched(engine: HFEngine) -> None:
    before = engine.stats()
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    prompts = _prompts(engine.tokenizer, 16)
    results = await asyncio.gather(*[engine.generate(p, params) for p in prompts])
    after = engine.stats()
    batches = after["batches"] - before["batches"]
    assert after["requests"] - before["requests"] == 16
    assert 1 <= batches < 16
    assert after["mean_batch_size"] > 1.0
    for c in results:
        _check_finish(engine, c, 12)
        assert c.text == engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
async def test_logprobs_match_teacher_forcing(engine: HFEngine, temperature: float) -> None:
    params = SamplingParams(temperature=temperature, max_new_tokens=16)
    prompts = _prompts(engine.tokenizer, 6)  # different lengths: exercises left padding
    results = await asyncio.gather(*[engine.generate(p, params) for p in prompts])
    for prompt, c in zip(prompts, results, strict=True):
        expected = _teacher_forced(engine.model, prompt, c.token_ids, temperature)
        worst = max(abs(a - b) for a, b in zip(c.logprobs, expected, strict=True))
        assert worst < LOGPROB_TOL, f"logprob mismatch {worst:.2e} at T={temperature}"
        assert all(lp <= 0.0 for lp in c.logprobs)


async def test_greedy_is_deterministic(engine: HFEngine) -> None:
    params = SamplingParams(temperature=0.0, max_new_tokens=16)
    prompts = _prompts(engine.tokenizer, 4)
    first = await asyncio.gather(*[engine.generate(p, params) for p in prompts])
    second = await asyncio.gather(*[engine.generate(p, params) for p in prompts])
    assert [c.token_ids for c in first] == [c.token_ids for c in second]
    for prompt, c in zip(prompts, first, strict=True):  # greedy: each token is the argmax of teacher forcing
        ids = torch.tensor([prompt + c.token_ids])
        with torch.inference_mode():
            argmax = engine.model(ids).logits[0, len(prompt) - 1 : -1].argmax(-1).tolist()
        assert argmax == c.token_ids


async def test_mixed_sampling_params_are_grouped(engine: HFEngine) -> None:
    short, long_ = SamplingParams(max_new_tokens=3), SamplingParams(max_new_tokens=9, temperature=0.5)
    prompts = _prompts(engine.tokenizer, 6)
    params = [short, long_] * 3
    before = engine.stats()["batches"]
    results = await asyncio.gather(*[engine.generate(p, q) for p, q in zip(prompts, params, strict=True)])
    assert engine.stats()["batches"] - before >= 2
    for c, q in zip(results, params, strict=True):
        _check_finish(engine, c, q.max_new_tokens)


async def test_cancelled_queued_request_is_dropped(tiny_path: Path) -> None:
    eng = HFEngine(tiny_path, max_batch=1, batch_wait_ms=0.0)
    await eng.start()
    try:
        prompts = _prompts(eng.tokenizer, 3)
        params = SamplingParams(temperature=1.0, max_new_tokens=48)
        first = asyncio.create_task(eng.generate(prompts[0], params))
        await asyncio.sleep(0.05)  # the first request is now running alone (max_batch=1)
        doomed = asyncio.create_task(eng.generate(prompts[1], params))
        last = asyncio.create_task(eng.generate(prompts[2], params))
        await asyncio.sleep(0)
        doomed.cancel()
        done = await asyncio.gather(first, last)
        with pytest.raises(asyncio.CancelledError):
            await doomed
        for c in done:
            _check_finish(eng, c, 48)
        assert eng.stats()["batches"] == 2.0  # the cancelled request never ran
    finally:
        await eng.close()


async def test_generate_needs_start(tiny_path: Path) -> None:
    eng = HFEngine(tiny_path)
    with pytest.raises(RuntimeError, match="start"):
        await eng.generate([1, 2], SamplingParams())
    await eng.close()


async def test_engine_drives_a_multi_turn_context(engine: HFEngine) -> None:
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    ctx = TurnContext()
    for turn in range(3):
        ctx, prompt = append_user(ctx, engine.tokenizer, f"observation {turn}", "system")
        c = await engine.generate(prompt, params)
        ctx = append_completion(ctx, c.token_ids, c.logprobs, c.text, engine.version)
    assert len(ctx.token_ids) == len(ctx.logprobs) == len(ctx.loss_mask)
    assert ctx.turn_versions == [0, 0, 0]
    assert_teacher_forced(engine, ctx)


def assert_teacher_forced(engine: HFEngine, ctx: TurnContext) -> None:
    """The whole trajectory's logprobs, recomputed in one teacher-forced pass, match what the engine reported."""
    ids = torch.tensor([ctx.token_ids])
    with torch.inference_mode():
        logp = torch.log_softmax(engine.model(ids).logits[0, :-1].float(), dim=-1)
    recomputed = logp.gather(1, ids[0, 1:, None]).squeeze(1).tolist()
    for start, end in ctx.turn_spans:
        for i in range(start, end):
            assert abs(recomputed[i - 1] - ctx.logprobs[i]) < LOGPROB_TOL


async def test_scripted_engine(engine: HFEngine) -> None:
    tok = engine.tokenizer
    scripted = ScriptedEngine(tok, ["\\boxed{3}", "\\boxed{7}"])
    assert isinstance(scripted, Engine) and isinstance(engine, Engine)
    await scripted.start()
    params = SamplingParams(max_new_tokens=40)
    texts = [(await scripted.generate([1], params)).text for _ in range(3)]
    assert texts == ["\\boxed{3}", "\\boxed{7}", "\\boxed{3}"]
    c = await scripted.generate([1], params)
    assert c.token_ids[-1] == tok.eos_token_id and c.finish_reason == "stop"
    assert c.logprobs == [0.0] * len(c.token_ids)
    cut = await ScriptedEngine(tok, "a long scripted reply").generate([1], SamplingParams(max_new_tokens=2))
    assert len(cut.token_ids) == 2 and cut.finish_reason == "length"
    assert scripted.stats()["requests"] == 4.0
    await scripted.close()


async def test_load_engine_resolves_tiny(tmp_path: Path) -> None:
    eng = load_engine(ModelConfig(name_or_path="tiny", max_batch=4, batch_wait_ms=1.0), cache_dir=tmp_path)
    assert isinstance(eng, HFEngine)
    assert eng.max_batch == 4 and eng.version == 0 and (tmp_path / "tiny-qwen2").is_dir()
    await eng.close()


@pytest.mark.parametrize(
    ("dtype", "native", "expected"),
    [
        ("auto", True, torch.bfloat16),
        ("auto", False, torch.float32),  # an AVX2-only CPU: bf16 would be emulated
        ("float32", True, torch.float32),
        ("bfloat16", False, torch.bfloat16),  # forced, even where it is slow
    ],
)
async def test_load_engine_takes_the_dtype_from_the_config_and_the_hardware(
    tmp_path: Path, dtype: str, native: bool, expected: torch.dtype
) -> None:
    cpu = CpuInfo("AVX512", frozenset({"avx512_f", "avx512_bf16"})) if native else CpuInfo("AVX2", frozenset({"avx2"}))
    model = ModelConfig(name_or_path="tiny", dtype=dtype)  # type: ignore[arg-type]
    precision = resolve_dtype(model.dtype, "cpu", cpu=cpu)
    eng = load_engine(model, cache_dir=tmp_path, precision=precision)
    assert isinstance(eng, HFEngine) and eng.dtype == expected
    await eng.close()


async def test_load_engine_auto_is_this_machines_native_choice(tmp_path: Path) -> None:
    eng = load_engine(ModelConfig(name_or_path="tiny"), cache_dir=tmp_path)
    assert isinstance(eng, HFEngine) and eng.dtype == getattr(torch, choose_precision("cpu").dtype)
    await eng.close()


async def test_close_fails_requests_in_flight(tiny_path: Path) -> None:
    eng = HFEngine(tiny_path, max_batch=1, batch_wait_ms=0.0)
    await eng.start()
    prompts = _prompts(eng.tokenizer, 2)
    params = SamplingParams(temperature=1.0, max_new_tokens=256)
    running = asyncio.create_task(eng.generate(prompts[0], params))
    await asyncio.sleep(0.02)
    queued = asyncio.create_task(eng.generate(prompts[1], params))
    await asyncio.sleep(0)
    await eng.close()
    for task in (running, queued):
        with pytest.raises(RuntimeError, match="engine closed"):
            await task
