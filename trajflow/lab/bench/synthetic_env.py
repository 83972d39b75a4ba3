"""A synthetic environment for pipeline benchmarks: episodes of random length whose steps take random time.

An episode lasts `turns` steps, drawn uniformly from [min_turns, max_turns] by the episode's seed; it
terminates at its last step (the env decides the length, not a turn limit). Each step's delay, in the
workload's time unit, is Gaussian(mean, sigma) truncated at 0 by clipping (a negative draw becomes 0, so
E[delay] = mean·Φ(mean/σ) + σ·φ(mean/σ), a little above `mean` when σ is large). The last step pays a reward
of 0 or 1 (a fair coin), so GRPO groups have some spread. Delays and rewards come from the same seeded RNG,
in order, so an episode replays identically.

Pure: this module draws numbers and says how long a step should take; the activity that hosts it sleeps.
Not covered: observations carry no task; actions are ignored (any text is a valid move).
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass

ENV_ID = "synthetic:gaussian-delay"


@dataclass(frozen=True)
class SyntheticSpec:
    """The workload of one synthetic env: how long episodes are and how long each step takes (in units)."""

    mean: float = 5.0
    """Mean of the Gaussian step delay before clipping at 0, in units."""
    sigma: float = 1.0
    """Standard deviation of the step delay, in units."""
    min_turns: int = 1
    max_turns: int = 8

    def __post_init__(self) -> None:
        if self.sigma < 0 or not math.isfinite(self.mean) or not math.isfinite(self.sigma):
            raise ValueError(f"step delay needs a finite mean and sigma >= 0, got {self.mean}, {self.sigma}")
        if not 1 <= self.min_turns <= self.max_turns:
            raise ValueError(f"need 1 <= min_turns <= max_turns, got {self.min_turns}, {self.max_turns}")

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, object]) -> SyntheticSpec:
        """The spec from a trajectory's `env_kwargs` (unknown keys are an error: a typo must not pass)."""
        unknown = set(kwargs) - {"mean", "sigma", "min_turns", "max_turns"}
        if unknown:
            raise ValueError(f"unknown synthetic env kwargs: {sorted(unknown)}")
        fields: dict[str, float | int] = {}
        for key in ("mean", "sigma"):
            if key in kwargs:
                fields[key] = float(kwargs[key])  # type: ignore[arg-type]
        for key in ("min_turns", "max_turns"):
            if key in kwargs:
                fields[key] = int(kwargs[key])  # type: ignore[call-overload]
        return cls(**fields)  # type: ignore[arg-type]

    def as_kwargs(self) -> dict[str, str | int | float | bool | None]:
        """The spec as a trajectory's `env_kwargs` (typed as their values are, so it can be passed as is)."""
        return asdict(self)

    @property
    def mean_turns(self) -> float:
        return (self.min_turns + self.max_turns) / 2.0

    @property
    def mean_delay(self) -> float:
        """E[max(0, X)], X ~ N(mean, sigma²)."""
        if self.sigma == 0:
            return max(0.0, self.mean)
        z = self.mean / self.sigma
        cdf = 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))
        pdf = math.exp(-z * z / 2.0) / math.sqrt(2.0 * math.pi)
        return self.mean * cdf + self.sigma * pdf


@dataclass(frozen=True)
class SyntheticStep:
    observation: str
    reward: float
    terminated: bool
    delay_units: float
    """How long this step takes, in units (the host sleeps it)."""


def episode_seed(seed: int, trajectory_id: str) -> int:
    """One episode's seed from the task seed and the trajectory's id.

    Samples of one GRPO group share the task seed, but a real policy's samples differ, and so do their episode
    lengths; mixing in the trajectory id gives each sample its own length and delays, reproducibly.
    """
    return (seed * 1_000_003 + zlib.crc32(trajectory_id.encode())) & 0x7FFF_FFFF_FFFF_FFFF


class SyntheticEpisode:
    def __init__(self, spec: SyntheticSpec, seed: int) -> None:
        self.spec = spec
        self._rng = random.Random(seed)
        self.turns = self._rng.randint(spec.min_turns, spec.max_turns)
        self.turn = 0

    @property
    def done(self) -> bool:
        return self.turn >= self.turns

    def reset(self) -> str:
        return f"Synthetic episode of {self.turns} turn(s). Turn 1: make a move."

    def step(self, action: str) -> SyntheticStep:
        """Advance one turn; ValueError once the episode is over."""
        if self.done:
            raise ValueError(f"the episode ended after {self.turns} turn(s); no more steps")
        delay = max(0.0, self._rng.gauss(self.spec.mean, self.spec.sigma))
        self.turn += 1
        if self.done:
            reward = float(self._rng.random() < 0.5)
            return SyntheticStep("Episode over.", reward, True, delay)
        return SyntheticStep(f"Turn {self.turn + 1}: make a move.", 0.0, False, delay)
