"""The synthetic workload of `trajflow bench pipeline` and the arithmetic around it (pure: no Temporal, no I/O).

Times are in workload units (one unit = the median LLM turn); `unit_s` converts them to seconds.

The default workload (fixed, so figures compare with the papers' agentic setting and cannot drift):
B = 64 trajectories per step in groups of n = 8; 1–8 turns per trajectory (uniform); each turn's decode time
log-normal (median 1 unit, σ = 1.0, so E = e^0.5 ≈ 1.65 units) on a simulated engine with S = 32 batch slots;
each env step Gaussian(mean 5, σ) units clipped at 0; a training step takes 30% of the sync mode's mean
generation phase (measured by a pilot).

Ideal bound (what no scheduler can beat on this workload), per trainer step of B trajectories:

    step time  >=  max( T ,  B · E[turns] · E[decode] / S )
    ideal_tps   =  min( B / T ,  S / (E[turns] · E[decode]) )          [trajectories per unit]

- T: the training step. Steps are serial (step k+1 trains on samples admitted under version k), so a run can
  never take fewer than T units per step, however well generation overlaps it: the critical path.
- S / (E[turns]·E[decode]): decode capacity. Every turn of every trajectory holds one of S slots for its decode
  time, so S slots finish at most S / E[decode] turns per unit, i.e. that many / E[turns] trajectories.
Env steps run on unbounded hosts and overlap everything, so they add latency, not a throughput bound.

Admission bound per α (a diagnostic beside the ideal; α-specific): the training workflow keeps at most
(α+1)·B samples admitted, and a group's n budget slots are held from its admission until the train step that
consumes it ends (only then does the version advance and free them). By Little's law

    tps(α)  <=  (α+1) · B / ( E[group latency] + T )

where E[group latency] = E[max over the n members of Σ_turns (decode + env)] (no queueing), estimated by
Monte Carlo from the workload. For the sync barrier the same law is exact with the whole batch:
sync tps <= B / (E[max over the B members] + T).

Not covered: Temporal's own latency and throughput limits (the bench measures those separately as the
orchestration ceiling), decode time that depends on batch size or tokens.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
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


def quick_workload(**overrides: object) -> Workload:
    """The `--quick` shape (a smoke run, under a minute here): B=8 in groups of 4, 2 steps, σ ∈ {1, 10}, 0.01 s units.

    B is 8, not 16: at B=16 a quick run took 69-75 s on this shared 2-core machine, most of it Temporal round
    trips (the training workflow starts its children one at a time, each awaiting its start)."""
    fields: dict[str, object] = dict(
        batch_size=8, group_size=4, steps=2, pilot_steps=1, sigmas=(1.0, 10.0), unit_s=0.01, quick=True
    )
    fields.update(overrides)
    return Workload(**fields)  # type: ignore[arg-type]


@dataclass(frozen=True)
class IdealBound:
    decode_capacity: float
    """S / (E[turns]·E[decode]), trajectories per unit."""
    train_bound: float
    """B / T, trajectories per unit."""
    ideal: float
    """min of the two, trajectories per unit."""
    limited_by: str

    FORMULA = "ideal_tps = min(B/T, S/(E[turns]·E[decode]))  (per unit; ÷ unit_s for per second)"


def ideal_bound(w: Workload, train_units: float) -> IdealBound:
    decode = w.slots / (w.mean_turns * w.mean_decode)
    train = w.batch_size / train_units if train_units > 0 else math.inf
    return IdealBound(decode, train, min(decode, train), "decode capacity" if decode <= train else "train step")


def group_latency_units(
    w: Workload, sigma: float, members: int | None = None, samples: int = 2000, seed: int = 0
) -> float:
    """E[max over `members` trajectories (default: a group) of Σ_turns (decode + env)] in units, by Monte Carlo,
    without queueing: how long a group (or, with members = B, a sync batch) takes at the very least."""
    rng = random.Random(seed)
    n = members or w.group_size
    total = 0.0
    for _ in range(samples):
        worst = 0.0
        for _ in range(n):
            turns = rng.randint(w.min_turns, w.max_turns)
            t = sum(
                w.decode_median * math.exp(w.decode_sigma * rng.gauss(0, 1)) + max(0.0, rng.gauss(w.env_mean, sigma))
                for _ in range(turns)
            )
            worst = max(worst, t)
        total += worst
    return total / samples


def admission_bound(w: Workload, alpha: int, train_units: float, latency: float) -> float:
    """(α+1)·B / (E[latency] + T): Little's law on the admission budget, trajectories per unit. `latency` is the
    group latency for α ≥ 1 and the whole batch's (members = B) for the sync barrier, where it is exact:
    sync tps <= B / (E[batch latency] + T)."""
    return (alpha + 1) * w.batch_size / (latency + train_units)


def generation_phases(step_times: Sequence[float], train_s: Sequence[float]) -> list[float]:
    """Sync mode: step k's generation phase = its end − its train time − the previous step's end."""
    phases, prev = [], 0.0
    for t, tr in zip(step_times, train_s, strict=True):
        phases.append(t - tr - prev)
        prev = t
    return phases


def steady_tps(step_times: Sequence[float], batch_size: int) -> float:
    """Trajectories trained per second between the end of step 1 and the end of the last step: B·(N−1)/(t_N − t_1).
    Leaves out the first step, i.e. the pipeline fill (the same rule for every mode)."""
    if len(step_times) < 2 or step_times[-1] <= step_times[0]:
        raise ValueError("steady-state throughput needs two step times, increasing")
    return batch_size * (len(step_times) - 1) / (step_times[-1] - step_times[0])


def whole_run_tps(step_times: Sequence[float], batch_size: int) -> float:
    """Trajectories trained per second over the whole run, fill included: B·N / t_N."""
    return batch_size * len(step_times) / step_times[-1]


def mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs else 0.0
