"""`trajflow bench batching`: the HF engine's static and continuous batching (`[model] batching`) side by side, in one
process on this machine, on two workloads.

Each (workload, mode) gets a fresh `trajflow.rl.engines.hf.HFEngine` (SmolLM2-135M-Instruct in the dtype
`trajflow.rl.precision` picks for the CPU unless `--dtype` forces one, the decode worker's threads unless
`--threads`, and the default config's `max_batch` (32), `batch_wait_ms` (10) and prefix cache (1024 MB), in both
modes) and plays the same trajectories: each one a closed loop of turns, its next request
sent when its last completion returns, all trajectories started at once, as the decode worker sees the concurrent
trajectories of a step.

- `demo`: the default task's shape: 16 trajectories of 4 turns (`--quick`: 8 of 2), GuessTheNumber-v0-easy's first
  observation (from GEM, seed per trajectory) and "Enter your next guess." after every completion, T = 0.7,
  `max_new_tokens` 32, seeded per trajectory and turn.
- `long-tail`: 32 trajectories of one turn (`--quick`: 16), each with its own `max_new_tokens` from a Pareto
  distribution (shape 1.1, scale 4; `long_tail_budgets`) rounded up to a power of two and capped at 256 (`--quick`:
  128): most turns short, a few long. Static batches group only requests with the same sampling params, so the
  budgets are powers of two to leave them groups to batch (unrounded, every budget would run alone).

Reported per mode: wall seconds, completion tokens and decode tokens/s (all tokens over the wall time), p50/p99
request latency (from the call to its completion; with under 100 requests p99 is the slowest), requests/s and
trajectories/s; then each as a ratio continuous/static. Also whether both modes generated the same tokens (seeded
sampling should, up to float ties).
The machine: the CPU model, cores, whether it has native bf16, the load average before and after.

Limits: one machine, whatever else runs on it; a closed loop with no env time between turns (the env's seconds
would hide part of the gap); an untrained model's completions end at EOS where it chooses, so the long tail is the
budgets', and generated lengths are reported; `--tiny` uses the tiny random model (a smoke test, not a measurement).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODES = ("static", "continuous")
STAND_IN = "Enter your next guess."
ENV_ID = "game:GuessTheNumber-v0-easy"


@dataclass(frozen=True)
class Shape:
    name: str
    trajectories: int
    turns: int
    budgets: list[int]
    """`max_new_tokens` of each trajectory (all its turns)."""


def long_tail_budgets(n: int, cap: int, seed: int = 0) -> list[int]:
    """`n` budgets at evenly spaced quantiles of a Pareto(1.1) scaled by 4 (a representative draw, not a random
    one), each rounded up to a power of two (so at least 8) and capped at `cap`, in a seeded random order: about half
    are 8, one in ten 64 or more."""
    draws = [4 * (1 - (i + 0.5) / n) ** (-1 / 1.1) for i in range(n)]
    budgets = [min(cap, 2 ** math.ceil(math.log2(d))) for d in draws]
    random.Random(seed).shuffle(budgets)
    return budgets


def shapes(quick: bool) -> list[Shape]:
    n = 8 if quick else 16
    return [
        Shape("demo", n, 2 if quick else 4, [32] * n),
        Shape("long-tail", 2 * n, 1, long_tail_budgets(2 * n, 128 if quick else 256)),
    ]


def first_observations(n: int) -> list[str]:
    """The default task's first user message of seeds 0..n-1."""
    import gem

    from trajflow.envs.formatting import observation_message

    return [observation_message(*gem.make(ENV_ID).reset(seed=i)) for i in range(n)]


async def play(engine: Any, shape: Shape, observations: list[str]) -> dict[str, Any]:
    """Every trajectory of `shape` at once, each turn sent when its last returns; latencies, tokens, completions."""
    from trajflow.contracts.records import TurnContext
    from trajflow.contracts.trajectory import SamplingParams
    from trajflow.rl.chat import append_completion, append_user

    latencies: list[float] = []
    completions: list[list[int]] = [[] for _ in range(shape.trajectories)]

    async def trajectory(i: int) -> None:
        ctx, message = TurnContext(model=engine.name), observations[i]
        for turn in range(shape.turns):
            ctx, prompt = append_user(ctx, engine.tokenizer, message, "")
            params = SamplingParams(temperature=0.7, max_new_tokens=shape.budgets[i], seed=1000 * turn + i)
            sent = time.perf_counter()
            c = await engine.generate(prompt, params)
            latencies.append(time.perf_counter() - sent)
            completions[i].extend(c.token_ids)
            ctx, message = append_completion(ctx, c.token_ids, c.logprobs, c.text, c.policy_version), STAND_IN

    started = time.perf_counter()
    await asyncio.gather(*(trajectory(i) for i in range(shape.trajectories)))
    seconds = time.perf_counter() - started
    tokens = sum(len(c) for c in completions)
    ordered = sorted(latencies)
    return {
        "seconds": round(seconds, 3),
        "requests": len(latencies),
        "completion_tokens": tokens,
        "tokens_per_s": round(tokens / seconds, 2),
        "p50_latency_s": round(statistics.median(ordered), 3),
        "p99_latency_s": round(ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)], 3),
        "requests_per_s": round(len(latencies) / seconds, 4),
        "trajectories_per_s": round(shape.trajectories / seconds, 4),
        "mean_batch_size": round(engine.stats()["mean_batch_size"], 2),
        "completions": completions,
    }


async def run_mode(
    mode: str, model: Path, shape: Shape, observations: list[str], threads: int, dtype: str
) -> dict[str, Any]:
    import torch

    from trajflow.contracts.config import ModelConfig
    from trajflow.rl.engines.hf import HFEngine
    from trajflow.rl.precision import resolve_dtype

    dtype = resolve_dtype(dtype, "cpu").dtype
    config = ModelConfig()
    engine = HFEngine(
        model,
        max_batch=config.max_batch,
        batch_wait_ms=config.batch_wait_ms,
        torch_threads=threads,
        dtype=getattr(torch, dtype),
        prefix_cache_bytes=config.prefix_cache_mb * 2**20,
        continuous=mode == "continuous",
    )
    await engine.start()
    try:
        figures = await play(engine, shape, observations)
    finally:
        await engine.close()
    print(f"batching bench: {shape.name}, {mode}: {figures['seconds']:.1f} s", file=sys.stderr, flush=True)
    return {"mode": mode, "dtype": dtype, **figures}


RATIOS = ("tokens_per_s", "p50_latency_s", "p99_latency_s", "requests_per_s", "trajectories_per_s")


def compare(static: dict[str, Any], continuous: dict[str, Any]) -> dict[str, Any]:
    """continuous/static of each figure, and how many trajectories generated the same tokens in both."""
    ratios = {k: round(continuous[k] / static[k], 3) if static[k] else None for k in RATIOS}
    pairs = zip(static["completions"], continuous["completions"], strict=True)
    return {"ratios": ratios, "identical_trajectories": sum(a == b for a, b in pairs)}


def run(models_dir: Path, quick: bool, tiny: bool, threads: int | None, dtype: str = "auto") -> dict[str, Any]:
    from infra.placement import worker_env
    from trajflow.contracts.config import RunConfig
    from trajflow.lab.bench.real_report import machine
    from trajflow.rl.models import resolve_model

    model = resolve_model("tiny" if tiny else "smollm2", models_dir)
    threads = threads or int(worker_env(RunConfig(), "decode")["TRAJFLOW_THREADS"])
    load_before = os.getloadavg()
    workloads = []
    for shape in shapes(quick or tiny):
        observations = first_observations(shape.trajectories)
        static, continuous = (asyncio.run(run_mode(m, model, shape, observations, threads, dtype)) for m in MODES)
        workloads.append({"workload": shape.name, "turns": shape.turns, "trajectories": shape.trajectories,
                          "budgets": shape.budgets, "static": static, "continuous": continuous,
                          **compare(static, continuous)})  # fmt: skip
    return {
        "model": "tiny random Qwen2 (smoke test)" if tiny else "SmolLM2-135M-Instruct",
        "quick": quick,
        "threads": threads,
        "machine": machine(),
        "load_before": list(load_before),
        "load_after": list(os.getloadavg()),
        "workloads": workloads,
    }


def render(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"{report['model']}{' (quick)' if report['quick'] else ''} on {m['cpu']} ({m['cores']} cores, native bf16: "
        f"{m['native_bf16']}, {report['threads']} threads, {report['workloads'][0]['static']['dtype']}); load "
        f"average before {report['load_before'][0]:.2f}, after {report['load_after'][0]:.2f}"
    ]
    for w in report["workloads"]:
        lines.append(
            f"{w['workload']}: {w['trajectories']} trajectories x {w['turns']} turns, max_new_tokens {w['budgets']}"
        )
        lines.append(f"  {'':<12} {'s':>8} {'tokens':>7} {'tok/s':>8} {'p50 s':>7} {'p99 s':>7} {'req/s':>7} "
                     f"{'traj/s':>7} {'batch':>6}")  # fmt: skip
        for mode in MODES:
            r = w[mode]
            lines.append(
                f"  {mode:<12} {r['seconds']:>8.1f} {r['completion_tokens']:>7} {r['tokens_per_s']:>8.1f} "
                f"{r['p50_latency_s']:>7.2f} {r['p99_latency_s']:>7.2f} {r['requests_per_s']:>7.3f} "
                f"{r['trajectories_per_s']:>7.3f} {r['mean_batch_size']:>6.1f}"
            )
        ratios = ", ".join(f"{k} {v}" for k, v in w["ratios"].items())
        lines.append(f"  continuous/static: {ratios}; identical trajectories {w['identical_trajectories']}/"
                     f"{w['trajectories']}")  # fmt: skip
    return "\n".join(lines)


def write_plot(report: dict[str, Any], path: Path) -> Path:
    """Each workload's ratios continuous/static as bars (1 = even; above it, continuous has more of the figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(report["workloads"])
    for n, w in enumerate(report["workloads"]):
        xs = [i + n * width for i in range(len(RATIOS))]
        ax.bar(xs, [w["ratios"][k] or 0.0 for k in RATIOS], width=width, label=w["workload"])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(RATIOS))], [k.replace("_", " ") for k in RATIOS])
    ax.set_ylabel("continuous / static")
    m = report["machine"]
    ax.set_title(f"{report['model']}, {m['cpu']} ({m['cores']} cores), {report['threads']} threads", fontsize=9)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(
    quick: bool,
    json_path: Path | None,
    models_dir: Path,
    threads: int | None = None,
    tiny: bool = False,
    dtype: str = "auto",
) -> int:
    report = run(models_dir, quick, tiny, threads, dtype)
    print(render(report), flush=True)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2))
        print(f"json: {json_path}; plot: {write_plot(report, json_path.with_suffix('.png'))}", flush=True)
    return 0
