"""trajflow.rl.engines.sampling and the HF engine's seeded sampling: the inverse-CDF sampler draws exactly from
softmax(logits / T) over the top-p nucleus, a row's draws depend only on its seed, and a seeded request gets the same
tokens alone and batched with others, with logprobs that still match a teacher-forced pass (tiny model, float32)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import torch

from tests.unit.test_rl_engine import LOGPROB_TOL, _prompts, _teacher_forced
from trajflow.contracts.trajectory import SamplingParams, derive_seed
from trajflow.rl.engines.hf import HFEngine
from trajflow.rl.engines.sampling import SeededSampler, truncate_top_p
from trajflow.rl.models import build_tiny_model

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
DRAWS = 20_000
CHI2_CRITICAL = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52}
"""The chi-square distribution's 0.999 quantiles: a correct sampler exceeds them once in a thousand seeds sets; the
draws here are seeded, so the test is deterministic and this one set passes or fails the same way every time."""


def _draw(temperature: float, top_p: float) -> torch.Tensor:
    """One token per seed (seeds as a training run derives them): the argmax of the sampler's scores, as
    `generate`'s greedy step takes it."""
    seeds = [derive_seed(0, i) for i in range(DRAWS)]
    sampler = SeededSampler(seeds, temperature, top_p)
    scores = LOGITS.expand(DRAWS, -1).clone()
    return sampler(torch.zeros(DRAWS, 1, dtype=torch.long), scores).argmax(-1)  # type: ignore[arg-type]


def _chi2(tokens: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """The statistic over the tokens of non-zero probability, and its degrees of freedom."""
    counts = torch.bincount(tokens, minlength=len(probs)).double()
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token outside the nucleus was drawn"
    expected = probs[keep].double() * len(tokens)
    return float(((counts[keep] - expected) ** 2 / expected).sum()), int(keep.sum()) - 1


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.5, 1.0), (1.5, 1.0), (1.0, 0.8), (0.7, 0.95)])
def test_token_frequencies_match_softmax_over_the_nucleus(temperature: float, top_p: float) -> None:
    tokens = _draw(temperature, top_p)
    probs = torch.softmax(truncate_top_p(LOGITS[None] / temperature, top_p)[0], -1)
    stat, dof = _chi2(tokens, probs)
    assert stat < CHI2_CRITICAL[dof], f"chi2 {stat:.1f} with {dof} dof at T={temperature}, top_p={top_p}"


def test_one_rows_steps_are_draws_from_the_same_distribution() -> None:
    """A row draws from its one stream step after step (what a completion's tokens do)."""
    sampler = SeededSampler([derive_seed(1)], 1.0, 1.0)
    scores = LOGITS[None].clone()
    tokens = torch.stack([sampler(torch.zeros(1, 1, dtype=torch.long), scores)[0].argmax() for _ in range(DRAWS)])  # type: ignore[arg-type]
    stat, dof = _chi2(tokens, torch.softmax(LOGITS, -1))
    assert stat < CHI2_CRITICAL[dof]


def test_the_frequency_check_has_power() -> None:
    """The same draws against a wrong temperature fail the check by far: it would catch a sampler that ignored T."""
    tokens = _draw(0.5, 1.0)
    stat, dof = _chi2(tokens, torch.softmax(LOGITS, -1))
    assert stat > 10 * CHI2_CRITICAL[dof]


def test_top_p_keeps_the_smallest_set_that_reaches_the_mass() -> None:
    probs = torch.softmax(LOGITS, -1)  # 0.575, 0.211, 0.128, 0.078, 0.029, 0.004
    kept = lambda p: torch.isfinite(truncate_top_p(LOGITS[None], p)[0]).sum().item()  # noqa: E731
    assert kept(1.0) == 6 and kept(0.5) == 1 and kept(float(probs[0]) + 0.01) == 2 and kept(0.9) == 4


def test_a_rows_draws_depend_on_its_seed_only() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    alone = SeededSampler([8], 1.0, 0.9)
    crowd = SeededSampler([None, 7, 8, 123], 1.0, 0.9)
    drawn_alone, drawn_in_crowd = [], []
    for _ in range(20):  # one draw per step from each row's own stream
        drawn_alone.append(alone.draw(logits[2:3]).item())
        drawn_in_crowd.append(crowd.draw(logits)[2].item())
    assert drawn_alone == drawn_in_crowd
    assert len(set(drawn_alone)) > 1
    u = crowd.uniforms(torch.device("cpu"))
    assert u.shape == (4, 1) and len(set(u.flatten().tolist())) == 4


def test_the_sampler_refuses_greedy_and_a_wrong_batch() -> None:
    with pytest.raises(ValueError, match="greedy"):
        SeededSampler([1], 0.0, 1.0)
    with pytest.raises(ValueError, match="top_p"):
        SeededSampler([1], 1.0, 0.0)
    with pytest.raises(ValueError, match="2 rows"):
        SeededSampler([1, 2], 1.0, 1.0)(torch.zeros(3, 1, dtype=torch.long), torch.zeros(3, 4))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("rl-sampling") / "tiny")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engine(tiny_path: Path) -> AsyncIterator[HFEngine]:
    eng = HFEngine(tiny_path, max_batch=32, batch_wait_ms=50.0)
    await eng.start()
    yield eng
    await eng.close()


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.8, 0.9)])
async def test_a_seeded_request_draws_the_same_tokens_alone_and_in_a_batch(
    engine: HFEngine, temperature: float, top_p: float
) -> None:
    prompts = _prompts(engine.tokenizer, 6)  # different lengths: the batched row is left-padded
    mine = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=24, seed=1234)
    alone = await engine.generate(prompts[0], mine)
    others = [mine.model_copy(update={"seed": 99 + i}) for i in range(5)]
    before = engine.stats()["batches"]
    together = await asyncio.gather(
        *[engine.generate(p, q) for p, q in zip(prompts[1:], others, strict=True)], engine.generate(prompts[0], mine)
    )
    assert engine.stats()["batches"] - before == 1, "requests that differ only in their seed share one batch"
    batched = together[-1]
    assert batched.token_ids == alone.token_ids
    assert max(abs(a - b) for a, b in zip(batched.logprobs, alone.logprobs, strict=True)) < LOGPROB_TOL
    # every completion's logprobs are log_softmax(logits / T) of the unperturbed logits (untruncated by top-p)
    for prompt, c in zip([*prompts[1:], prompts[0]], together, strict=True):
        expected = _teacher_forced(engine.model, prompt, c.token_ids, temperature)
        assert max(abs(a - b) for a, b in zip(c.logprobs, expected, strict=True)) < LOGPROB_TOL
    # another seed draws other tokens (24 tokens from a near-uniform tiny model: equal only by a wrong seed path)
    other = await engine.generate(prompts[0], mine.model_copy(update={"seed": 1235}))
    assert other.token_ids != alone.token_ids


async def test_unseeded_requests_still_sample(engine: HFEngine) -> None:
    params = SamplingParams(temperature=1.0, max_new_tokens=24)
    prompt = _prompts(engine.tokenizer, 1)[0]
    draws = await asyncio.gather(*[engine.generate(prompt, params) for _ in range(4)])
    assert len({tuple(c.token_ids) for c in draws}) > 1  # the global RNG: not one fixed sequence
