"""The synthetic workload the soak benchmarks run on the simulated stack (pure: no Temporal, no I/O).

Times are in workload units (one unit = the median LLM turn); `unit_s` converts them to seconds.

The default workload (fixed, so figures compare with the papers' agentic setting and cannot drift):
B = 64 trajectories per step in groups of n = 8; 1–8 turns per trajectory (uniform); each turn's decode time
log-normal (median 1 unit, σ = 1.0, so E = e^0.5 ≈ 1.65 units) on a simulated engine with S = 32 batch slots;
each env step Gaussian(mean 5, σ) units clipped at 0; a training step takes 30% of the sync mode's mean
generation phase (measured by a pilot).

The ideal and admission bounds of the pipeline study (`trajflow bench pipeline`, a finished study: its results are
in docs/benchmarks.md, its code and this module's arithmetic for it in git history at ade1a13) are not here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Workload:
    batch_size: int = 64
    group_size: int = 8
    min_turns: int = 1
    max_turns: int = 8
    decode_median: float = 1.0
    """Median decode time of one turn, units (the definition of the unit)."""
    decode_sigma: float = 1.0
    slots: int = 32
    env_mean: float = 5.0
    env_sigma: float = 5.0
    """σ of the env delay in the sync/async training runs."""
    sigmas: tuple[float, ...] = (1.0, 5.0, 10.0)
    """σ values of the trajectory- vs batch-level comparison."""
    train_fraction: float = 0.3
    """Training step time as a fraction of the sync mode's mean generation phase."""
    unit_s: float = 1.0
    steps: int = 6
    pilot_steps: int = 2
    repeats: int = 1
    """Rollouts per mode and σ in the trajectory- vs batch-level comparison."""
    seed: int = 0
    quick: bool = False
    alphas: tuple[int, ...] = field(default=(1, 2))

    def __post_init__(self) -> None:
        if self.batch_size % self.group_size:
            raise ValueError(f"batch size {self.batch_size} is not a multiple of the group size {self.group_size}")
        if self.steps < 2:
            raise ValueError("steady-state throughput needs at least 2 steps")

    @property
    def mean_turns(self) -> float:
        return (self.min_turns + self.max_turns) / 2.0

    @property
    def mean_decode(self) -> float:
        return self.decode_median * math.exp(self.decode_sigma**2 / 2.0)

    def mean_env(self, sigma: float | None = None) -> float:
        """E[max(0, X)], X ~ N(env_mean, σ²)."""
        s = self.env_sigma if sigma is None else sigma
        if s == 0:
            return max(0.0, self.env_mean)
        z = self.env_mean / s
        return self.env_mean * 0.5 * (1 + math.erf(z / math.sqrt(2))) + s * math.exp(-z * z / 2) / math.sqrt(
            2 * math.pi
        )

    def describe(self) -> str:
        return (
            f"synthetic workload: B={self.batch_size} trajectories/step in groups of {self.group_size}; "
            f"{self.min_turns}-{self.max_turns} turns/trajectory (uniform); decode log-normal(median "
            f"{self.decode_median:g} unit, σ={self.decode_sigma:g}; mean {self.mean_decode:.2f}) on {self.slots} "
            f"slots; env step Gaussian(mean {self.env_mean:g}, σ) units clipped at 0, σ={self.env_sigma:g} in the "
            f"training runs, σ∈{{{', '.join(f'{s:g}' for s in self.sigmas)}}} in the env comparison; train step = "
            f"{self.train_fraction:.0%} of the sync generation phase; 1 unit = {self.unit_s:g} s"
        )

    def as_dict(self) -> dict[str, object]:
        out = asdict(self)
        out.update(
            sigmas=list(self.sigmas),
            alphas=list(self.alphas),
            mean_turns=self.mean_turns,
            mean_decode_units=self.mean_decode,
            mean_env_units=self.mean_env(),
            description=self.describe(),
        )
        return out
