"""SimulatedEngine: an Engine whose decode time is drawn from a distribution, for pipeline benchmarks.

It models a continuous-batching server with a fixed number of batch slots (vLLM's `max_num_seqs`): at most
`slots` requests decode at once, each holding its slot for its own decode time, and a request that finds every
slot taken waits (FIFO) for one. A request's decode time is log-normal, `median_units · exp(sigma · Z)` with
Z ~ N(0, 1), in the workload's time unit (`unit_s` seconds), drawn from a seeded RNG when the request gets its
slot. Batch size does not change a request's time (the slots are what is limited).

Every completion is the same short text (`completion`, tokenized by the tokenizer passed in and ended with
EOS, logprobs 0.0), stamped like `ScriptedEngine` with the newest version the `WeightSource` publishes for the
request's policy, so the training loop's versions and staleness bookkeeping work unchanged.

`stats()` reports busy slot-seconds, queueing and the peak number of requests decoding, so a benchmark can
report decode utilisation = busy slot-seconds / (slots · wall seconds).

Not covered: token counts, prompt lengths and batch composition do not affect time; there is no model and no
weight loading (nothing is learned); the order of draws follows the order requests get slots, which depends on
scheduling, so a seed fixes the distribution, not which request gets which draw.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from typing import Any

from trajflow.contracts.trajectory import SamplingParams
from trajflow.rl.engines.base import Completion, WeightSource, eos_ids

DEFAULT_SLOTS = 32
DEFAULT_SIGMA = 1.0


def lognormal_mean(median: float, sigma: float) -> float:
    """E[median · exp(sigma · Z)] = median · exp(sigma² / 2)."""
    return median * math.exp(sigma * sigma / 2.0)


class SimulatedEngine:
    """See the module docstring. `sleep` is injectable for tests; it gets seconds."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        slots: int = DEFAULT_SLOTS,
        unit_s: float = 1.0,
        median_units: float = 1.0,
        sigma: float = DEFAULT_SIGMA,
        seed: int = 0,
        weights: WeightSource | None = None,
        completion: str = "\\boxed{5}",
        name: str = "simulated",
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        if unit_s <= 0 or median_units <= 0 or sigma < 0:
            raise ValueError("unit_s and median_units must be positive and sigma non-negative")
        self.tokenizer = tokenizer
        self.name = name
        self.version = 0
        self.weights = weights
        self.follows_training = weights is not None
        self.max_positions: int | None = None
        self.slots = slots
        self.unit_s = unit_s
        self.median_units = median_units
        self.sigma = sigma
        self._rng = random.Random(seed)
        eos = eos_ids(tokenizer)[0]
        self._ids = [*tokenizer.encode(completion, add_special_tokens=False), eos]
        self._text = str(tokenizer.decode(self._ids, skip_special_tokens=True))
        self._sem: asyncio.Semaphore | None = None
        self._active = 0
        self.reset_stats()

    # --- the Engine protocol ---------------------------------------------------------------------------------

    async def start(self) -> None:
        self._sem = self._sem or asyncio.Semaphore(self.slots)

    async def close(self) -> None:
        return None

    def available_version(self, policy: str) -> int:
        return self.weights.latest_version(policy) if self.weights is not None and policy else self.version

    async def generate(self, prompt_ids: list[int], params: SamplingParams, policy: str = "") -> Completion:
        if self._sem is None:
            await self.start()
        assert self._sem is not None
        queued = time.monotonic()
        self._requests += 1
        async with self._sem:
            started = time.monotonic()
            self._wait_s += started - queued
            self._active += 1
            self._peak = max(self._peak, self._active)
            units = self.draw_units()
            try:
                await asyncio.sleep(units * self.unit_s)
            finally:
                self._active -= 1
                self._busy_s += time.monotonic() - started
                self._drawn_units += units
                self._drawn += 1
        self._done += 1
        ids = self._ids[: params.max_new_tokens]
        reason = "stop" if len(ids) == len(self._ids) else "length"
        text = self._text if reason == "stop" else str(self.tokenizer.decode(ids, skip_special_tokens=True))
        return Completion(list(ids), [0.0] * len(ids), text, reason, self.available_version(policy))

    # --- the simulation --------------------------------------------------------------------------------------

    def draw_units(self) -> float:
        """One decode time in units: log-normal with the engine's median and sigma."""
        return self.median_units * math.exp(self.sigma * self._rng.gauss(0.0, 1.0))

    @property
    def mean_units(self) -> float:
        return lognormal_mean(self.median_units, self.sigma)

    def reset_stats(self) -> None:
        """Start a new measurement window (requests in flight keep counting into the new one)."""
        self._requests = 0
        self._done = 0
        self._busy_s = 0.0
        self._wait_s = 0.0
        self._drawn_units = 0.0
        self._drawn = 0
        self._peak = self._active
        self._since = time.monotonic()

    def stats(self) -> dict[str, float]:
        wall = time.monotonic() - self._since
        return {
            "requests": float(self._requests),
            "completed": float(self._done),
            "busy_slot_s": self._busy_s,
            "utilisation": self._busy_s / (self.slots * wall) if wall > 0 else 0.0,
            "mean_queue_wait_s": self._wait_s / self._requests if self._requests else 0.0,
            "mean_decode_units": self._drawn_units / self._drawn if self._drawn else 0.0,
            "peak_active": float(self._peak),
            "slots": float(self.slots),
            "wall_s": wall,
        }
