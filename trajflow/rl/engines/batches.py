"""What the HF engine's two batching loops (static, in `trajflow.rl.engines.hf`, and
`trajflow.rl.engines.continuous`) share: a queued request, the engine's counters, and a batch's left-padded layout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from trajflow.contracts.trajectory import SamplingParams
from trajflow.rl.engines.base import Completion


@dataclass
class EngineStats:
    """What `HFEngine.stats` reports, counted by both batching loops."""

    requests: int = 0
    batches: int = 0
    batched_requests: int = 0
    completion_tokens: int = 0
    busy_s: float = 0.0
    weight_loads: int = 0
    slot_switches: int = 0
    """Switches to weights a parked slot held, with nothing loaded."""
    prompt_tokens: int = 0
    reused_tokens: int = 0
    """Prompt tokens whose keys and values came from the prefix cache instead of a forward pass."""

    def as_dict(self) -> dict[str, float]:
        return {
            "weight_loads": float(self.weight_loads),
            "slot_switches": float(self.slot_switches),
            "requests": float(self.requests),
            "batches": float(self.batches),
            "mean_batch_size": self.batched_requests / self.batches if self.batches else 0.0,
            "completion_tokens": float(self.completion_tokens),
            "busy_s": self.busy_s,
            "tokens_per_s": self.completion_tokens / self.busy_s if self.busy_s > 0 else 0.0,
            "prompt_tokens": float(self.prompt_tokens),
            "prefix_reused_tokens": float(self.reused_tokens),
        }


def left_padded(prompts: Sequence[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (rows, width) of `prompts` left-padded with `pad_id` to the longest, and their attention mask (1 on
    each prompt's tokens): the layout of a batch for `generate` and for the continuous loop's prefill."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return input_ids, mask


@dataclass
class Request:
    """One queued `generate` call."""

    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future[Completion]
    policy: str = ""
    enqueued: float = field(default_factory=time.monotonic)
