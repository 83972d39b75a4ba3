"""HFEngine(continuous=True): the same completions as static batches (greedy and seeded), requests that join a
running batch and leave it when done, honest logprobs, cancellation, failed steps, and a new policy version that
drains the batch. All on the tiny random model (float32, CPU)."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch
from pydantic import ValidationError

from trajflow.contracts.config import ModelConfig
from trajflow.contracts.engines import PolicyWeights
from trajflow.contracts.trajectory import SamplingParams
from trajflow.rl.engines.base import Completion
from trajflow.rl.engines.hf import HFEngine
from trajflow.rl.engines.load import load_engine

LOGPROB_TOL = 1e-4
"""As in test_rl_engine.py: float32 batched decode vs one teacher-forced pass differ by ~1e-6."""


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def static(tiny_model: Path) -> AsyncIterator[HFEngine]:
    eng = HFEngine(tiny_model, max_batch=8, batch_wait_ms=0.0)
    await eng.start()
    yield eng
    await eng.close()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def continuous(tiny_model: Path) -> AsyncIterator[HFEngine]:
    eng = HFEngine(tiny_model, max_batch=8, batch_wait_ms=0.0, continuous=True)
    await eng.start()
    yield eng
    await eng.close()


def _prompts(tokenizer: Any, n: int) -> list[list[int]]:
    return [tokenizer.encode(f"Guess the number {i}. " * (1 + i % 4)) for i in range(n)]


async def _until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll `condition` (bounded), yielding to the engine's loop between looks."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.001)


async def _after_steps(engine: HFEngine, steps: int) -> None:
    start = engine.stats()["batches"]
    await _until(lambda: engine.stats()["batches"] >= start + steps)


async def _staggered(engine: HFEngine, prompts: list[list[int]], params: list[SamplingParams]) -> list[Completion]:
    """Each request arrives two decode steps after the one before it, or as soon as every earlier one has ended
    (an unseeded row of the tiny model's 498-token vocabulary draws EOS in its first tokens about 2% of the time,
    and an idle engine takes no steps to wait for)."""
    tasks: list[asyncio.Task[Completion]] = []
    for prompt, p in zip(prompts, params, strict=True):
        start = engine.stats()["batches"]
        tasks.append(asyncio.create_task(engine.generate(prompt, p)))
        await _until(lambda start=start: engine.stats()["batches"] >= start + 2 or all(t.done() for t in tasks))
    return await asyncio.gather(*tasks)


def _params(temperature: float, n: int, top_p: float = 1.0) -> list[SamplingParams]:
    seeded = temperature > 0
    return [
        SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=6 + 5 * i, seed=100 + i if seeded else None)
        for i in range(n)
    ]


@pytest.mark.parametrize(("temperature", "top_p"), [(0.0, 1.0), (1.0, 1.0), (0.8, 0.9)])
async def test_same_completions_as_static(
    static: HFEngine, continuous: HFEngine, temperature: float, top_p: float
) -> None:
    prompts = _prompts(static.tokenizer, 6)
    params = _params(temperature, 6, top_p)
    alone = [await static.generate(p, q) for p, q in zip(prompts, params, strict=True)]
    joined = await _staggered(continuous, prompts, params)
    assert max(c.batch_requests for c in joined) > 1  # they did share steps
    for a, b, q in zip(alone, joined, params, strict=True):
        assert b.token_ids == a.token_ids
        assert (b.finish_reason, b.text, b.policy_version) == (a.finish_reason, a.text, a.policy_version)
        assert len(b.token_ids) == q.max_new_tokens or b.finish_reason == "stop"
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < LOGPROB_TOL


async def test_logprobs_match_teacher_forcing(continuous: HFEngine) -> None:
    prompts = _prompts(continuous.tokenizer, 6)
    temperatures = [1.0, 0.0, 0.7, 1.3, 0.0, 0.5]
    params = [SamplingParams(temperature=t, max_new_tokens=12 + i) for i, t in enumerate(temperatures)]
    results = await _staggered(continuous, prompts, params)
    for prompt, c, t in zip(prompts, results, temperatures, strict=True):
        ids = torch.tensor([prompt + c.token_ids])
        with torch.inference_mode():
            logits = continuous.model(ids).logits[0, len(prompt) - 1 : -1].float()
        expected = torch.log_softmax(logits / (t if t > 0 else 1.0), dim=-1)
        expected = expected.gather(1, torch.tensor(c.token_ids)[:, None]).squeeze(1)
        assert (torch.tensor(c.logprobs) - expected).abs().max().item() < LOGPROB_TOL
        if t == 0:
            assert logits.argmax(-1).tolist() == c.token_ids


async def _conversations(engine: HFEngine, turns: int, n: int) -> list[list[Completion]]:
    """`n` trajectories at once, each turn's prompt its last prompt, its completion and a new user message."""
    from trajflow.contracts.records import TurnContext
    from trajflow.rl.chat import append_completion, append_user

    async def one(i: int) -> list[Completion]:
        ctx, done = TurnContext(), []
        for turn in range(turns):
            ctx, prompt = append_user(ctx, engine.tokenizer, f"Guess {i}, turn {turn}. " * (1 + i % 3), "Play.")
            params = SamplingParams(temperature=0.7, max_new_tokens=6 + 3 * i, seed=10 * i + turn)
            done.append(await engine.generate(prompt, params))
            ctx = append_completion(ctx, done[-1].token_ids, done[-1].logprobs, done[-1].text, 0)
        return done

    return await asyncio.gather(*(one(i) for i in range(n)))


async def test_the_prefix_cache_changes_no_completion(static: HFEngine, tiny_model: Path) -> None:
    eng = HFEngine(tiny_model, max_batch=8, batch_wait_ms=0.0, continuous=True, prefix_cache_bytes=2**24)
    await eng.start()
    try:
        cached = await _conversations(eng, 3, 4)
        assert eng.stats()["prefix_reused_tokens"] > eng.stats()["prompt_tokens"] / 3
    finally:
        await eng.close()
    plain = await _conversations(static, 3, 4)
    for a_turns, b_turns in zip(plain, cached, strict=True):
        for a, b in zip(a_turns, b_turns, strict=True):
            assert a.token_ids == b.token_ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < LOGPROB_TOL


async def test_a_late_request_joins_the_running_batch(continuous: HFEngine) -> None:
    long_prompt, short_prompt = _prompts(continuous.tokenizer, 2)
    long = asyncio.create_task(continuous.generate(long_prompt, SamplingParams(temperature=0.0, max_new_tokens=300)))
    await _after_steps(continuous, 5)
    short = await continuous.generate(short_prompt, SamplingParams(temperature=1.0, max_new_tokens=4))
    assert not long.done()  # the short one joined the running batch and left it before the long one ended
    assert short.batch_requests == 2 and len(short.token_ids) <= 4
    assert len((await long).token_ids) == 300


async def test_a_finished_row_frees_its_slot(tiny_model: Path) -> None:
    eng = HFEngine(tiny_model, max_batch=2, batch_wait_ms=0.0, continuous=True)
    await eng.start()
    try:
        a, b, c = _prompts(eng.tokenizer, 3)
        long = asyncio.create_task(eng.generate(a, SamplingParams(temperature=0.0, max_new_tokens=300)))
        short = asyncio.create_task(eng.generate(b, SamplingParams(temperature=0.0, max_new_tokens=3)))
        third = await asyncio.create_task(eng.generate(c, SamplingParams(temperature=0.0, max_new_tokens=3)))
        assert short.done() and not long.done()  # the third took the short one's slot, beside the long one
        assert third.batch_requests == 2 and eng.stats()["mean_batch_size"] <= 2.0
        await long
    finally:
        await eng.close()


async def test_cancelled_requests_are_dropped(tiny_model: Path) -> None:
    eng = HFEngine(tiny_model, max_batch=2, batch_wait_ms=0.0, continuous=True)
    await eng.start()
    try:
        prompts = _prompts(eng.tokenizer, 4)
        greedy = SamplingParams(temperature=0.0, max_new_tokens=200)
        running = asyncio.create_task(eng.generate(prompts[0], greedy))
        kept = asyncio.create_task(eng.generate(prompts[1], greedy))
        queued = asyncio.create_task(eng.generate(prompts[2], greedy))  # no room: max_batch=2
        await _after_steps(eng, 3)
        assert len(eng._running) == 2
        queued.cancel()
        running.cancel()
        await _until(lambda: len(eng._running) == 1)  # the running one left the batch at the next step
        done = await kept
        assert len(done.token_ids) == 200
        for task in (running, queued):
            with pytest.raises(asyncio.CancelledError):
                await task
        after = await eng.generate(prompts[3], SamplingParams(max_new_tokens=5))
        assert 1 <= len(after.token_ids) <= 5
        assert eng.stats()["prompt_tokens"] == len(prompts[0]) + len(prompts[1]) + len(prompts[3])
    finally:
        await eng.close()


class _FailingModel:
    """The engine's model, failing its next forward pass once `armed` (a prefill's only, with `prefill_only`)."""

    def __init__(self, model: Any) -> None:
        self.model, self.config, self.armed, self.prefill_only = model, model.config, False, False

    def __call__(self, **kwargs: Any) -> Any:
        if self.armed and (kwargs["input_ids"].shape[1] > 1 or not self.prefill_only):
            self.armed = False
            raise RuntimeError("injected failure")
        return self.model(**kwargs)


async def test_a_failed_step_fails_its_requests_not_the_loop(tiny_model: Path) -> None:
    eng = HFEngine(tiny_model, max_batch=4, batch_wait_ms=0.0, continuous=True)
    await eng.start()
    try:
        failing = _FailingModel(eng.model)
        eng.model = failing
        prompts = _prompts(eng.tokenizer, 3)
        running = asyncio.create_task(eng.generate(prompts[0], SamplingParams(temperature=0.0, max_new_tokens=300)))
        await _after_steps(eng, 3)
        failing.armed = True
        with pytest.raises(RuntimeError, match="injected failure"):
            await running
        failing.armed = True  # now the prefill of a fresh request fails
        with pytest.raises(RuntimeError, match="injected failure"):
            await eng.generate(prompts[1], SamplingParams(max_new_tokens=4))
        after = await eng.generate(prompts[2], SamplingParams(max_new_tokens=4))
        assert 1 <= len(after.token_ids) <= 4
        greedy = SamplingParams(temperature=0.0, max_new_tokens=100)  # greedy: this prompt's 100 tokens hold no EOS
        running = asyncio.create_task(eng.generate(prompts[0], greedy))
        await _after_steps(eng, 3)
        failing.armed = failing.prefill_only = True  # a request joining the running one fails alone
        with pytest.raises(RuntimeError, match="injected failure"):
            await eng.generate(prompts[1], SamplingParams(max_new_tokens=4))
        assert not running.done() and len((await running).token_ids) == 100
    finally:
        await eng.close()


class _Versions:
    """A weight source whose policy "run" is at `version` (its weights: the tiny model's own)."""

    def __init__(self, path: Path) -> None:
        self.path, self.version = path, 0

    def latest(self, policy: str) -> PolicyWeights | None:
        return PolicyWeights(policy, self.version, self.path) if self.version else None

    def latest_version(self, policy: str) -> int:
        return self.version


async def _new_version_while_a_row_runs(
    eng: HFEngine, source: _Versions
) -> tuple[asyncio.Task[Completion], Completion]:
    """A greedy 100-token row of policy "run" starts, v1 is published after its third step, and two steps later a
    short request of the same policy arrives: the running row's task and the late request's completion."""
    a, b = _prompts(eng.tokenizer, 2)
    long = asyncio.create_task(eng.generate(a, SamplingParams(temperature=0.0, max_new_tokens=100), "run"))
    await _after_steps(eng, 3)
    source.version = 1
    await _after_steps(eng, 2)  # the batch has seen the new version
    late = await eng.generate(b, SamplingParams(max_new_tokens=4), "run")
    return long, late


async def test_a_new_version_drains_the_batch_first(tiny_model: Path) -> None:
    source = _Versions(tiny_model)
    eng = HFEngine(tiny_model, max_batch=4, batch_wait_ms=0.0, continuous=True, weights=source)
    await eng.start()
    try:
        long, late = await _new_version_while_a_row_runs(eng, source)
        assert long.done() and (await long).policy_version == 0  # it finished on the weights it started on
        assert late.policy_version == 1 and late.batch_requests == 1  # loaded after the drain, never joined
        assert eng.stats()["weight_loads"] == 1.0
    finally:
        await eng.close()


async def test_the_config_selects_the_mode(tmp_path: Path) -> None:
    eng = load_engine(ModelConfig(name_or_path="tiny", batching="continuous", prefix_cache_mb=8), cache_dir=tmp_path)
    assert isinstance(eng, HFEngine) and eng.continuous and eng.prefix_cache is not None
    await eng.close()
    with pytest.raises(ValidationError, match="batching"):
        ModelConfig(engine="vllm", batching="continuous")


async def test_interrupt_on_update_moves_running_rows_to_the_new_version(tiny_model: Path) -> None:
    source = _Versions(tiny_model)
    eng = HFEngine(
        tiny_model, max_batch=4, batch_wait_ms=0.0, continuous=True, interrupt_on_update=True, weights=source
    )
    await eng.start()
    try:
        long, late = await _new_version_while_a_row_runs(eng, source)  # loaded in place; the long row went on
        assert not long.done() and late.batch_requests == 2  # no drain: it joined the running row
        assert (late.policy_version, late.versions) == (1, [])
        spanning = await long
        assert (spanning.policy_version, spanning.versions) == (0, [0, 1])  # staleness counts from the oldest
        assert len(spanning.token_ids) == 100 and eng.stats()["weight_loads"] == 1.0
    finally:
        await eng.close()


async def test_sliding_window_models_fall_back_to_static(tiny_model: Path, tmp_path: Path) -> None:
    sliding = tmp_path / "sliding"
    shutil.copytree(tiny_model, sliding)
    config = json.loads((sliding / "config.json").read_text())
    layers = config["num_hidden_layers"]
    config.update(use_sliding_window=True, sliding_window=16, max_window_layers=0)
    config["layer_types"] = ["sliding_attention", "full_attention"] * (layers // 2)
    (sliding / "config.json").write_text(json.dumps(config))
    eng = HFEngine(sliding, continuous=True, batch_wait_ms=0.0)
    await eng.start()
    try:
        assert not eng.continuous
        c = await eng.generate(_prompts(eng.tokenizer, 1)[0], SamplingParams(max_new_tokens=3))
        assert 1 <= len(c.token_ids) <= 3
    finally:
        await eng.close()


async def test_an_interrupted_row_continues_on_the_new_weights(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    other = AutoModelForCausalLM.from_pretrained(tiny_model)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(0)) * 0.5)
    other.save_pretrained(tmp_path / "v1")
    source = _Versions(tmp_path / "v1")
    eng = HFEngine(tiny_model, batch_wait_ms=0.0, continuous=True, interrupt_on_update=True, weights=source)
    await eng.start()
    try:
        prompt = _prompts(eng.tokenizer, 1)[0]
        greedy = SamplingParams(temperature=0.0, max_new_tokens=60)
        before = await eng.generate(prompt, greedy, "run")  # all v0
        task = asyncio.create_task(eng.generate(prompt, greedy, "run"))
        await _after_steps(eng, 10)
        source.version = 1
        spanning = await task
        after = await eng.generate(prompt, greedy, "run")  # all v1
    finally:
        await eng.close()
    assert (spanning.policy_version, spanning.versions, after.policy_version, after.versions) == (0, [0, 1], 1, [])
    parted = next(i for i, (a, b) in enumerate(zip(before.token_ids, spanning.token_ids, strict=False)) if a != b)
    assert parted >= 10  # v0's tokens up to the switch, then the new weights' choices
    assert spanning.token_ids != after.token_ids


def test_interrupt_on_update_needs_continuous(tiny_model: Path) -> None:
    with pytest.raises(ValidationError, match="interrupt_on_update"):
        ModelConfig(interrupt_on_update=True)
    with pytest.raises(ValueError, match="interrupt_on_update"):
        HFEngine(tiny_model, interrupt_on_update=True)


async def test_close_fails_running_and_waiting_requests(tiny_model: Path) -> None:
    eng = HFEngine(tiny_model, max_batch=1, batch_wait_ms=0.0, continuous=True)
    await eng.start()
    greedy = SamplingParams(temperature=0.0, max_new_tokens=300)
    a, b = _prompts(eng.tokenizer, 2)
    running, waiting = (asyncio.create_task(eng.generate(p, greedy)) for p in (a, b))
    await _after_steps(eng, 3)
    await eng.close()
    for task in (running, waiting):
        with pytest.raises(RuntimeError, match="engine closed"):
            await task
