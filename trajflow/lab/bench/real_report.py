"""The figures of `trajflow bench real`, from what Temporal recorded: step end times, activity spans.

Pure functions (no Temporal, no torch), so the arithmetic is unit-tested on its own:
- throughput per mode: `trajflow.lab.bench.workload.steady_tps` (B·(N−1)/(t_N − t_1): the first step, the pipeline fill,
  is left out for every mode alike);
- the sync run's generation time G and training time T per step (G = step end − its train time − previous end,
  steps 2..N; T = the mean train time);
- the reference ratio (G + T) / max(G, T): what perfect overlap of the two stages would give over sync;
- busy fractions: the union of a stage's activity spans (`llm.generate` of the run's trajectories for decode,
  `trainer.train_step` for the trainer) inside the steady window [t_1, t_N], over the window. Decode is "busy"
  while at least one of its requests is in flight (waiting to be batched included): an upper bound on the
  engine's compute time, the same measure for every mode.
"""

from __future__ import annotations

import platform
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from trajflow.lab.bench.workload import steady_tps

Span = tuple[float, float]


def union_seconds(spans: Sequence[Span], window: Span) -> float:
    """Seconds of `window` covered by at least one span."""
    lo, hi = window
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi)
    covered, end = 0.0, lo
    for a, b in clipped:
        if b <= end:
            continue
        covered += b - max(a, end)
        end = b
    return covered


@dataclass
class ModeFigures:
    label: str
    alpha: int
    sync: bool
    step_times_s: list[float]
    """Seconds since the run started at which each step ended."""
    train_s: list[float]
    tps: float
    busy: dict[str, float]
    """Stage -> busy fraction of the steady window."""
    wall_s: float
    counters: dict[str, int] = field(default_factory=dict)
    spans: dict[str, list[Span]] = field(default_factory=dict)
    """Stage -> its activity spans in seconds since the run started (for the timeline plot)."""
    train_parts: list[dict[str, float]] = field(default_factory=list)
    """Per step, the parts of its train_s the trainer reported: `compute_s` (the optimizer updates) and `load_s`
    (reading the batch from the store); the rest of train_s is writing the checkpoint and the weights."""
    waiting: dict[str, float] = field(default_factory=dict)
    """Per stack process, its threads' time runnable but waiting for a CPU over the same window, as cores
    (`cpu_use.cores_waiting`)."""
    cores: dict[str, float] = field(default_factory=dict)
    """Cores each stack process (and "other", "idle") used on average from step 1's end to the mode's end (the
    steady window, to within the bench's one-second poll; `cpu_use.cores_used`)."""
    sandboxes_started: int | None = None
    """Sandbox containers the Docker engine started while the mode ran (None: the engine could not be asked): with
    reuse (`TRAJFLOW_SANDBOX_REUSE`) far fewer than the trajectories started."""


def mode_figures(
    label: str,
    alpha: int,
    step_times: Sequence[float],
    train_s: Sequence[float],
    batch_size: int,
    spans: dict[str, list[Span]],
    start: float,
    wall_s: float,
    counters: dict[str, int] | None = None,
    train_parts: Sequence[dict[str, float]] = (),
    cores: dict[str, float] | None = None,
    waiting: dict[str, float] | None = None,
) -> ModeFigures:
    """One mode's figures. `spans` are absolute times; `start` is the absolute time the run started (step
    times are relative to it)."""
    window = (start + step_times[0], start + step_times[-1])
    width = window[1] - window[0]
    busy = {stage: (union_seconds(s, window) / width if width > 0 else 0.0) for stage, s in spans.items()}
    return ModeFigures(
        label=label,
        alpha=alpha,
        sync=alpha == 0,
        step_times_s=list(step_times),
        train_s=list(train_s),
        tps=steady_tps(step_times, batch_size),
        busy=busy,
        wall_s=wall_s,
        counters=counters or {},
        spans={stage: sorted((a - start, b - start) for a, b in ss) for stage, ss in spans.items()},
        train_parts=[dict(p) for p in train_parts],
        cores=dict(cores or {}),
        waiting=dict(waiting or {}),
    )


def trainer_split(mode: ModeFigures) -> dict[str, float]:
    """Mean seconds per step, steps 2..N (step 1 builds the trainer): the whole train_s, its optimizer updates
    (`compute_s`), its reads (`load_s`) and the rest (`write_s`: checkpoint and weights); and the updates' loss
    tokens per second over those steps (`tokens_per_s`, where the parts count tokens). Empty without parts."""
    pairs = list(zip(mode.train_s[1:], mode.train_parts[1:], strict=False))
    if not pairs:
        return {}
    train = statistics.fmean(t for t, _ in pairs)
    compute = statistics.fmean(p.get("compute_s", 0.0) for _, p in pairs)
    load = statistics.fmean(p.get("load_s", 0.0) for _, p in pairs)
    split = {"train_s": train, "compute_s": compute, "load_s": load, "write_s": max(0.0, train - compute - load)}
    tokens = sum(p.get("tokens", 0.0) for _, p in pairs)
    if tokens > 0:  # steps differ in length: a speed compares modes better than seconds (roughly: prompts cost too)
        split["tokens_per_s"] = tokens / sum(p.get("compute_s", 0.0) for _, p in pairs)
    return split


def sync_phases(step_times: Sequence[float], train_s: Sequence[float]) -> tuple[float, float]:
    """(G, T) of a sync run: mean generation and training seconds per step, steps 2..N (step 1 loads models)."""
    gens = [t - tr - prev for prev, t, tr in zip(step_times, step_times[1:], train_s[1:], strict=False)]
    if not gens:
        raise ValueError("G and T need a sync run of at least two steps")
    return statistics.fmean(gens), statistics.fmean(train_s[1:])


def summary(sync: ModeFigures, modes: Sequence[ModeFigures], machine: dict[str, object]) -> dict[str, object]:
    """The JSON the issue names: sync and async tps, speedups, the reference ratio, busy fractions, G and T."""
    g, t = sync_phases(sync.step_times_s, sync.train_s)
    ideal = (g + t) / max(g, t)
    speedup = {str(m.alpha): m.tps / sync.tps for m in modes}
    return {
        "sync_tps": sync.tps,
        "async_tps": {str(m.alpha): m.tps for m in modes},
        "speedup": speedup,
        "ideal_speedup": ideal,
        "of_ideal": {a: s / ideal for a, s in speedup.items()},
        "G_s": g,
        "T_s": t,
        "busy": {m.label: m.busy for m in (sync, *modes)},
        "trainer_split": {m.label: trainer_split(m) for m in (sync, *modes)},
        "cores": {m.label: m.cores for m in (sync, *modes)},
        "sandboxes_started": {m.label: m.sandboxes_started for m in (sync, *modes)},
        "waiting": {m.label: m.waiting for m in (sync, *modes)},
        "modes": [asdict(m) for m in (sync, *modes)],
        "machine": machine,
    }


def render(s: dict[str, object]) -> str:
    """The report as lines of text."""
    busy: dict[str, dict[str, float]] = s["busy"]  # type: ignore[assignment]
    speed: dict[str, float] = s["speedup"]  # type: ignore[assignment]
    of_ideal: dict[str, float] = s["of_ideal"]  # type: ignore[assignment]
    tps: dict[str, float] = s["async_tps"]  # type: ignore[assignment]
    lines = [
        f"machine: {s['machine']}",
        f"sync (alpha 0): {s['sync_tps']:.4f} traj/s   G = {s['G_s']:.1f} s, T = {s['T_s']:.1f} s per step",
        f"reference ratio (G + T) / max(G, T) = {s['ideal_speedup']:.2f}",
    ]
    for alpha, value in speed.items():
        lines.append(
            f"alpha {alpha}: {tps[alpha]:.4f} traj/s   speedup {value:.2f}x  ({of_ideal[alpha]:.0%} of the reference)"
        )
    for label, fractions in busy.items():
        lines.append(f"busy {label:8} " + "  ".join(f"{k} {v:.0%}" for k, v in fractions.items()))
    split: dict[str, dict[str, float]] = s.get("trainer_split", {})  # type: ignore[assignment]
    for label, parts in split.items():
        if parts:
            lines.append(
                f"trainer {label:8} {parts['train_s']:.1f} s a step: updates {parts['compute_s']:.1f} s, "
                f"reads {parts['load_s']:.1f} s, checkpoint and weights {parts['write_s']:.1f} s"
                + (f"; updates at {parts['tokens_per_s']:.0f} loss tokens/s" if "tokens_per_s" in parts else "")
            )
    cores: dict[str, dict[str, float]] = s.get("cores", {})  # type: ignore[assignment]
    for label, used in cores.items():
        if used:
            lines.append(f"cores {label:8} " + "  ".join(f"{k} {v:.2f}" for k, v in used.items()))
    modes: list[dict] = s.get("modes", [])  # type: ignore[assignment]
    for m in modes:
        if m.get("sandboxes_started") is not None:
            started = m["counters"].get("started", 0)
            lines.append(
                f"sandboxes {m['label']:8} {m['sandboxes_started']} containers started for {started} trajectories"
            )
    waiting: dict[str, dict[str, float]] = s.get("waiting", {})  # type: ignore[assignment]
    for label, waits in waiting.items():
        if waits:
            lines.append(f"waiting for a CPU {label:8} " + "  ".join(f"{k} {v:.2f}" for k, v in waits.items()))
    return "\n".join(lines)


def machine() -> dict[str, object]:
    """The CPU this was measured on: model, cores, and whether it has native bf16 (AVX512-BF16 or AMX)."""
    import os
    from pathlib import Path

    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = info.get("flags", "").split()
    return {
        "cpu": info.get("model name", platform.processor()),
        "cores": os.cpu_count(),
        "native_bf16": "avx512_bf16" in flags or "amx_bf16" in flags,
    }
