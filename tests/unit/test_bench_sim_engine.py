"""trajflow.lab.bench.sim_engine: the simulated engine keeps its slot limit, draws log-normal decode times around the
median, stamps completions with the policy's newest published version, and ends completions with EOS."""

from __future__ import annotations

import asyncio
import math
import statistics

import pytest

from trajflow.contracts.trajectory import SamplingParams
from trajflow.lab.bench.sim_engine import SimulatedEngine, lognormal_mean


class FakeTokenizer:
    """Characters as token ids; id 0 is EOS."""

    eos_token_id = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if i != 0 or not skip_special_tokens)


class FakeWeights:
    def __init__(self, versions: dict[str, int]) -> None:
        self.versions = versions

    def latest(self, policy: str):
        return None

    def latest_version(self, policy: str) -> int:
        return self.versions.get(policy, 0)


async def test_no_more_requests_decode_at_once_than_slots() -> None:
    engine = SimulatedEngine(FakeTokenizer(), slots=4, unit_s=0.002, sigma=0.5, seed=1)
    await engine.start()
    results = await asyncio.gather(*(engine.generate([1, 2], SamplingParams()) for _ in range(24)))
    stats = engine.stats()
    assert len(results) == 24 and stats["completed"] == 24
    assert stats["peak_active"] == 4  # saturated, never above the limit
    assert stats["busy_slot_s"] > 0 and 0 < stats["utilisation"] <= 1.0


async def test_a_request_waits_for_a_free_slot() -> None:
    engine = SimulatedEngine(FakeTokenizer(), slots=1, unit_s=0.02, sigma=0.0, seed=0)
    await engine.start()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await asyncio.gather(*(engine.generate([1], SamplingParams()) for _ in range(3)))
    # sigma 0: every request takes exactly 1 unit; one slot serialises them
    assert loop.time() - t0 >= 3 * 0.02 * 0.95
    assert engine.stats()["mean_queue_wait_s"] > 0.0


def test_decode_times_are_lognormal_around_the_median() -> None:
    engine = SimulatedEngine(FakeTokenizer(), median_units=1.0, sigma=1.0, seed=123)
    draws = [engine.draw_units() for _ in range(20_000)]
    logs = [math.log(d) for d in draws]
    assert statistics.median(draws) == pytest.approx(1.0, rel=0.05)
    assert statistics.pstdev(logs) == pytest.approx(1.0, rel=0.05)
    assert statistics.fmean(draws) == pytest.approx(lognormal_mean(1.0, 1.0), rel=0.08)
    assert lognormal_mean(1.0, 1.0) == pytest.approx(math.exp(0.5))


def test_the_seed_fixes_the_draws() -> None:
    a = SimulatedEngine(FakeTokenizer(), seed=7)
    b = SimulatedEngine(FakeTokenizer(), seed=7)
    c = SimulatedEngine(FakeTokenizer(), seed=8)
    first = [a.draw_units() for _ in range(5)]
    assert first == [b.draw_units() for _ in range(5)]
    assert first != [c.draw_units() for _ in range(5)]


async def test_completions_carry_the_newest_published_version() -> None:
    engine = SimulatedEngine(FakeTokenizer(), unit_s=0.001, weights=FakeWeights({"run-a": 3}))
    await engine.start()
    assert engine.available_version("run-a") == 3
    assert (await engine.generate([1], SamplingParams(), "run-a")).policy_version == 3
    assert (await engine.generate([1], SamplingParams(), "")).policy_version == 0
    engine.weights.versions["run-a"] = 4  # type: ignore[union-attr]
    assert (await engine.generate([1], SamplingParams(), "run-a")).policy_version == 4


async def test_completion_ends_with_eos_or_is_cut_at_the_budget() -> None:
    engine = SimulatedEngine(FakeTokenizer(), unit_s=0.001, completion="abc")
    await engine.start()
    full = await engine.generate([1], SamplingParams(max_new_tokens=16))
    assert full.token_ids == [97, 98, 99, 0] and full.finish_reason == "stop" and full.text == "abc"
    assert full.logprobs == [0.0] * 4
    cut = await engine.generate([1], SamplingParams(max_new_tokens=2))
    assert cut.token_ids == [97, 98] and cut.finish_reason == "length" and cut.text == "ab"


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        SimulatedEngine(FakeTokenizer(), slots=0)
    with pytest.raises(ValueError):
        SimulatedEngine(FakeTokenizer(), unit_s=0.0)
