"""trajflow.rl.engines.prefix_cache and the HF engine's use of it: a later turn reuses the keys and values of the
trajectory's earlier prompt and completion (and episodes their shared instructions), and generates exactly what
the engine generates without the cache; a new policy version clears it. On the tiny random model (float32, CPU)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from tests.unit.test_rl_engine import assert_teacher_forced
from trajflow.contracts.records import TurnContext
from trajflow.contracts.trajectory import SamplingParams
from trajflow.rl.chat import append_completion, append_user
from trajflow.rl.engines.base import Completion
from trajflow.rl.engines.hf import HFEngine
from trajflow.rl.engines.prefix_cache import PrefixCache, common_prefix
from trajflow.rl.models import build_tiny_model

LOGPROB_TOL = 1e-4
"""As in test_rl_engine: float32 sums in another order differ by ~1e-6; a wrong position is off by > 1e-2."""


def kv(length: int, fill: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((2, length, 4), fill), torch.full((2, length, 4), fill)) for _ in range(3)]


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix([1, 2, 3, 4], [1, 2, 3]) == 3
    assert common_prefix([1, 2, 9, 4, 5], [1, 2, 3, 4, 5]) == 2
    assert common_prefix([7], [1]) == 0
    assert common_prefix([], [1]) == 0
    for n in range(12):
        a = list(range(12))
        b = [*a[:n], -1, *a[n + 1 :]]
        assert common_prefix(a, b) == n


def test_match_takes_the_longest_shared_prefix_up_to_the_limit() -> None:
    cache = PrefixCache(max_bytes=10**9)
    cache.add([1, 2, 3], kv(3))
    cache.add([1, 2, 8, 9, 10], kv(5))
    entry, n = cache.match([1, 2, 8, 9, 11], limit=4)
    assert entry is not None and entry.tokens == [1, 2, 8, 9, 10] and n == 4
    entry, n = cache.match([1, 2, 8, 9, 10, 11], limit=3)
    assert n == 3, "never more than the limit (the engine keeps at least one prompt token to feed)"
    assert cache.match([5, 6], limit=1) == (None, 0)


def test_an_entry_replaces_those_it_extends_and_the_oldest_go_over_budget() -> None:
    one = sum(k.nbytes + v.nbytes for k, v in kv(1))
    cache = PrefixCache(max_bytes=10 * one)
    cache.add([1, 2], kv(2))
    cache.add([1, 2, 3, 4], kv(4))  # the next turn of the same trajectory
    assert len(cache) == 1 and cache.nbytes == 4 * one
    cache.add([5, 6, 7], kv(3))
    cache.add([8, 9, 10], kv(3))  # 10 tokens' worth: at the budget
    assert len(cache) == 3
    cache.match([1, 2, 3, 4, 5], limit=4)  # used: now the most recent
    cache.add([11], kv(1))  # over budget: the least recently used ([5, 6, 7]) goes
    assert [e.tokens for e in cache._entries.values()] == [[8, 9, 10], [1, 2, 3, 4], [11]]
    assert cache.nbytes == 8 * one
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("prefix-cache") / "tiny")


async def play(engine: HFEngine, episodes: int, turns: int, params: SamplingParams) -> list[list[Completion]]:
    """`episodes` conversations of `turns` turns, every turn's requests concurrent (one batch)."""
    ctxs = [TurnContext() for _ in range(episodes)]
    played = []
    for turn in range(turns):
        prompts = []
        for i in range(episodes):
            text = "Guess a number between 1 and 10." if turn == 0 else f"Higher than that ({i}). Again."
            ctxs[i], ids = append_user(ctxs[i], engine.tokenizer, text, "Play well.")
            prompts.append(ids)
        seeded = [params.model_copy(update={"seed": 100 * turn + i}) for i in range(episodes)]
        done = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, seeded, strict=True)))
        for i, c in enumerate(done):
            ctxs[i] = append_completion(ctxs[i], c.token_ids, c.logprobs, c.text, c.policy_version)
        played.append(list(done))
    return played


@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_turns_reuse_earlier_ones_and_generate_what_no_cache_does(tiny_path: Path, temperature: float) -> None:
    params = SamplingParams(temperature=temperature, max_new_tokens=12)
    results, stats = [], []
    for cache_bytes in (0, 2**28):
        engine = HFEngine(tiny_path, max_batch=8, batch_wait_ms=50.0, prefix_cache_bytes=cache_bytes)
        await engine.start()
        try:
            results.append(await play(engine, episodes=6, turns=3, params=params))
            results.append(await play(engine, episodes=6, turns=1, params=params))  # new episodes, same instructions
            stats.append(engine.stats())
        finally:
            await engine.close()
    plain, cached = results[:2], results[2:]
    assert stats[0]["prefix_reused_tokens"] == 0
    # every later turn reuses its trajectory's earlier ones; the second set of episodes the shared instructions
    assert stats[1]["prefix_reused_tokens"] > 0.6 * stats[1]["prompt_tokens"]
    for a_run, b_run in zip(plain, cached, strict=True):
        for a_turn, b_turn in zip(a_run, b_run, strict=True):
            for a, b in zip(a_turn, b_turn, strict=True):
                assert a.token_ids == b.token_ids
                assert a.logprobs == pytest.approx(b.logprobs, abs=LOGPROB_TOL)


async def test_reused_keys_give_the_teacher_forced_logprobs(tiny_path: Path) -> None:
    engine = HFEngine(tiny_path, max_batch=8, batch_wait_ms=50.0, prefix_cache_bytes=2**28)
    await engine.start()
    try:
        ctx = TurnContext()
        for turn in range(4):
            ctx, prompt = append_user(ctx, engine.tokenizer, f"observation {turn}", "system")
            c = await engine.generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=8))
            ctx = append_completion(ctx, c.token_ids, c.logprobs, c.text, c.policy_version)
        assert engine.stats()["prefix_reused_tokens"] > 0
        assert_teacher_forced(engine, ctx)
    finally:
        await engine.close()
