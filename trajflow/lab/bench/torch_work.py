"""The real compute the torch benchmarks time, through the project's own code: a batch of generations on the HF
engine (`trajflow.rl.engines.hf.HFEngine`) and optimizer steps of the trainer (`trajflow.rl.trainer.PolicyTrainer`) on
samples shaped like the default job's (trajflow/configs/default.toml: GuessTheNumber, up to 4 turns of at most 32 new
tokens).

Used by `trajflow.lab.bench.gpu_check` (a GPU, random weights; the GPU tests, tests/gpu, through it). The rounds
take the HF engine or the vLLM one. Imports
torch, transformers and `rl` only: no temporalio, docker or boto3, so it runs where only torch is installed.

Sample shape (an estimate, not a recording): a 160-token prompt, then 1 to 4 turns (cycled over the batch) of 32
generated tokens (in the loss) and a 28-token observation (not), so 220 to 400 tokens per sequence.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trajflow.contracts.trajectory import SamplingParams
from trajflow.rl.samples import TrainSample

if TYPE_CHECKING:
    from trajflow.rl.engines.base import Completion
    from trajflow.rl.engines.hf import HFEngine
    from trajflow.rl.engines.vllm import VLLMEngine

PROMPT_TOKENS = 160
TURN_TOKENS = 32
OBSERVATION_TOKENS = 28


@dataclass(frozen=True)
class DecodeRound:
    batch: int
    new_tokens: int
    tokens: int
    """Tokens generated (fewer than batch x new_tokens when some completions stopped at EOS)."""
    seconds: float
    """The engine's busy time for the batch (model.generate, without the batching wait)."""
    started: float
    ended: float
    """Wall clock (time.time()) around the round, to line it up with another process's timings."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def prompts(
    batch: int, vocab: int, length: int = PROMPT_TOKENS, seed: int = 0, avoid: set[int] | None = None
) -> list[list[int]]:
    """`batch` prompts of `length` random token ids below `vocab` (never one in `avoid`, e.g. EOS)."""
    rng = random.Random(seed)
    banned = avoid or set()
    pool = [t for t in range(min(vocab, 65536)) if t not in banned]
    return [[rng.choice(pool) for _ in range(length)] for _ in range(batch)]


async def decode_round(
    engine: HFEngine | VLLMEngine, batch: list[list[int]], new_tokens: int, temperature: float = 0.7
) -> DecodeRound:
    """Generate for every prompt of `batch` at once (the engine batches them) and time it. The engine must be
    started with `max_batch >= len(batch)`."""
    return (await generate_round(engine, batch, new_tokens, temperature))[0]


async def generate_round(
    engine: HFEngine | VLLMEngine, batch: list[list[int]], new_tokens: int, temperature: float = 0.7
) -> tuple[DecodeRound, list[Completion]]:
    """`decode_round`, with the completions (in the order of `batch`)."""
    if engine.max_batch < len(batch):
        raise ValueError(f"the engine batches at most {engine.max_batch}, the round has {len(batch)} prompts")
    params = SamplingParams(temperature=temperature, max_new_tokens=new_tokens)
    before = engine.stats()
    started = time.time()
    completions = await asyncio.gather(*(engine.generate(p, params) for p in batch))
    ended = time.time()
    after = engine.stats()
    tokens = sum(len(c.token_ids) for c in completions)
    seconds = after["busy_s"] - before["busy_s"]
    return DecodeRound(len(batch), new_tokens, tokens, seconds, started, ended), completions


def episode_samples(count: int, vocab: int, seed: int = 0) -> list[TrainSample]:
    """`count` training samples shaped like the default job's episodes (see the module docstring), with random
    token ids, behaviour logprobs near a sampled token's and advantages of both signs."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        turns = 1 + i % 4
        ids = [rng.randrange(vocab) for _ in range(PROMPT_TOKENS)]
        mask = [0] * PROMPT_TOKENS
        for _ in range(turns):
            ids += [rng.randrange(vocab) for _ in range(TURN_TOKENS + OBSERVATION_TOKENS)]
            mask += [1] * TURN_TOKENS + [0] * OBSERVATION_TOKENS
        logprobs = [-rng.uniform(0.5, 3.0) if m else 0.0 for m in mask]
        out.append(TrainSample(ids, logprobs, mask, advantage=1.0 if i % 2 else -1.0))
    return out


@dataclass(frozen=True)
class TrainerStep:
    seconds: float
    tokens: int
    """Tokens in the batch (every position the forward pass computes, prompt included)."""
    started: float
    ended: float


def time_steps(step: Callable[[], object], samples: list[TrainSample], count: int) -> list[TrainerStep]:
    """Run `step` (one optimizer step on `samples`) `count` times and time each."""
    tokens = sum(len(s.token_ids) for s in samples)
    out = []
    for _ in range(count):
        started = time.time()
        step()
        ended = time.time()
        out.append(TrainerStep(ended - started, tokens, started, ended))
    return out


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
