"""`trajflow bench batching`: the HF engine's static and continuous batching (`[model] batching`) side by side, in one
process on this machine, on two workloads.

Each (workload, mode) gets a fresh `trajflow.rl.engines.hf.HFEngine` (SmolLM2-135M-Instruct on `--device`, the CPU
by default, in the dtype `trajflow.rl.precision` picks there unless `--dtype` forces one, the decode worker's threads
unless `--threads`, and the default config's `max_batch` (32), `batch_wait_ms` (10) and prefix cache (1024 MB, or
`--prefix-cache-mb`), in both modes) and plays the same trajectories: each one a closed loop of turns, its next request
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
The machine: the CPU model, cores, whether it has native bf16, the GPU where one ran, the load average before and
after. `--random-weights` plays the same shapes on SmolLM2's architecture with random weights and token-id prompts
(`TokenTurns`), for a machine with neither the pretrained model nor GEM (a lent GPU): `python -m
trajflow.lab.bench.batching` then needs only torch, transformers and pydantic.

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


class ChatTurns:
    """Each trajectory's prompts as a decode worker sees them: its chat so far (the model's template) with the next
    user message appended: the env's first observation, then `STAND_IN` after every completion."""

    def __init__(self, engine: Any, observations: list[str]) -> None:
        self.engine, self.observations, self.contexts = engine, observations, {}

    def prompt(self, i: int, last: Any | None) -> list[int]:
        from trajflow.contracts.records import TurnContext
        from trajflow.rl.chat import append_completion, append_user

        ctx, message = self.contexts.get(i) or TurnContext(model=self.engine.name), self.observations[i]
        if last is not None:
            ctx = append_completion(ctx, last.token_ids, last.logprobs, last.text, last.policy_version)
            message = STAND_IN
        self.contexts[i], prompt = append_user(ctx, self.engine.tokenizer, message, "")
        return prompt


class TokenTurns:
    """The same closed loop for a model with no chat template (`--random-weights`: SmolLM2's architecture, a
    word-level vocabulary): a random first prompt of `torch_work.PROMPT_TOKENS` ids, then the prompt so far, the
    completion and a fixed user turn of 8 ids."""

    def __init__(self, vocab: int, eos: set[int], n: int) -> None:
        from trajflow.lab.bench.torch_work import prompts

        self.so_far = dict(enumerate(prompts(n, vocab, seed=0, avoid=eos)))
        self.user = prompts(1, vocab, length=8, seed=1, avoid=eos)[0]

    def prompt(self, i: int, last: Any | None) -> list[int]:
        if last is not None:
            self.so_far[i] = [*self.so_far[i], *last.token_ids, *self.user]
        return self.so_far[i]


async def play(engine: Any, shape: Shape, turns: ChatTurns | TokenTurns) -> dict[str, Any]:
    """Every trajectory of `shape` at once, each turn sent when its last returns; latencies, tokens, completions."""
    from trajflow.contracts.trajectory import SamplingParams

    latencies: list[float] = []
    completions: list[list[int]] = [[] for _ in range(shape.trajectories)]

    async def trajectory(i: int) -> None:
        last = None
        for turn in range(shape.turns):
            prompt = turns.prompt(i, last)
            params = SamplingParams(temperature=0.7, max_new_tokens=shape.budgets[i], seed=1000 * turn + i)
            sent = time.perf_counter()
            last = await engine.generate(prompt, params)
            latencies.append(time.perf_counter() - sent)
            completions[i].extend(last.token_ids)

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
    mode: str,
    model: Path,
    shape: Shape,
    observations: list[str] | None,
    threads: int,
    dtype: str,
    device: str,
    prefix_cache_mb: int,
) -> dict[str, Any]:
    """One (workload, mode) on a fresh engine; `observations` None plays `TokenTurns` (a model with no chat
    template)."""
    import torch
    from transformers import AutoConfig

    from trajflow.contracts.config import ModelConfig
    from trajflow.rl.engines.hf import HFEngine
    from trajflow.rl.precision import resolve_dtype

    dtype = resolve_dtype(dtype, device).dtype
    config = ModelConfig()
    engine = HFEngine(
        model,
        max_batch=config.max_batch,
        batch_wait_ms=config.batch_wait_ms,
        device=device,
        torch_threads=threads,
        dtype=getattr(torch, dtype),
        prefix_cache_bytes=prefix_cache_mb * 2**20,
        continuous=mode == "continuous",
    )
    await engine.start()
    try:
        if observations is None:
            vocab = int(AutoConfig.from_pretrained(model).vocab_size)
            turns: ChatTurns | TokenTurns = TokenTurns(vocab, set(engine._eos), shape.trajectories)
        else:
            turns = ChatTurns(engine, observations)
        figures = await play(engine, shape, turns)
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


def run(
    models_dir: Path,
    quick: bool,
    tiny: bool,
    threads: int | None,
    dtype: str = "auto",
    device: str = "cpu",
    random_weights: bool = False,
    prefix_cache_mb: int | None = None,
) -> dict[str, Any]:
    """Both workloads in both modes, with the decode workers' prefix cache unless `prefix_cache_mb` (0: none).
    `random_weights`: SmolLM2's architecture with random weights and token-id prompts (`TokenTurns`; no pretrained
    model, no GEM: what a machine without them, such as a lent GPU, can run)."""
    import tempfile

    from trajflow.contracts.config import ModelConfig, RunConfig
    from trajflow.infra.placement import worker_env
    from trajflow.lab.bench.real_report import machine
    from trajflow.rl.devices import resolve_device

    device = resolve_device(device)
    cache_mb = ModelConfig().prefix_cache_mb if prefix_cache_mb is None else prefix_cache_mb
    threads = threads or int(worker_env(RunConfig(), "decode")["TRAJFLOW_THREADS"])
    load_before = os.getloadavg()
    workloads = []
    with tempfile.TemporaryDirectory(prefix="batching-") as tmp:
        if random_weights:
            from trajflow.lab.bench.gpu_check import build_random_model

            model = build_random_model(Path(tmp) / "smollm2-135m-random", quick=tiny)
        else:
            from trajflow.rl.models import resolve_model

            model = resolve_model("tiny" if tiny else "smollm2", models_dir)
        for shape in shapes(quick or tiny):
            observations = None if random_weights else first_observations(shape.trajectories)
            static, continuous = (
                asyncio.run(run_mode(m, model, shape, observations, threads, dtype, device, cache_mb)) for m in MODES
            )
            workloads.append(
                {
                    "workload": shape.name,
                    "turns": shape.turns,
                    "trajectories": shape.trajectories,
                    "budgets": shape.budgets,
                    "static": static,
                    "continuous": continuous,
                    **compare(static, continuous),
                }
            )
    name = "tiny random Qwen2 (smoke test)" if tiny else "SmolLM2-135M-Instruct"
    if random_weights:
        name = "SmolLM2-135M architecture, random weights" if not tiny else "quick: 2 blocks, random (smoke test)"
    return {
        "model": name,
        "device": device,
        "gpu": _gpu_name(device),
        "quick": quick,
        "threads": threads,
        "prefix_cache_mb": cache_mb,
        "machine": machine(),
        "load_before": list(load_before),
        "load_after": list(os.getloadavg()),
        "workloads": workloads,
    }


def _gpu_name(device: str) -> str | None:
    """The CUDA device's name where `device` is one, else None."""
    if not device.startswith("cuda"):
        return None
    import torch

    return torch.cuda.get_device_name(torch.device(device))


def render(report: dict[str, Any]) -> str:
    m = report["machine"]
    on = f"{report['gpu']} ({report['device']}), host CPU " if report.get("gpu") else ""
    lines = [
        f"{report['model']}{' (quick)' if report['quick'] else ''} on {on}{m['cpu']} ({m['cores']} cores, native "
        f"bf16: {m['native_bf16']}, {report['threads']} threads, {report['workloads'][0]['static']['dtype']}, prefix "
        f"cache {report.get('prefix_cache_mb', '?')} MB); load "
        f"average before {report['load_before'][0]:.2f}, after {report['load_after'][0]:.2f}"
    ]
    for w in report["workloads"]:
        lines.append(
            f"{w['workload']}: {w['trajectories']} trajectories x {w['turns']} turns, max_new_tokens {w['budgets']}"
        )
        lines.append(
            f"  {'':<12} {'s':>8} {'tokens':>7} {'tok/s':>8} {'p50 s':>7} {'p99 s':>7} {'req/s':>7} "
            f"{'traj/s':>7} {'batch':>6}"
        )
        for mode in MODES:
            r = w[mode]
            lines.append(
                f"  {mode:<12} {r['seconds']:>8.1f} {r['completion_tokens']:>7} {r['tokens_per_s']:>8.1f} "
                f"{r['p50_latency_s']:>7.2f} {r['p99_latency_s']:>7.2f} {r['requests_per_s']:>7.3f} "
                f"{r['trajectories_per_s']:>7.3f} {r['mean_batch_size']:>6.1f}"
            )
        ratios = ", ".join(f"{k} {v}" for k, v in w["ratios"].items())
        lines.append(
            f"  continuous/static: {ratios}; identical trajectories {w['identical_trajectories']}/{w['trajectories']}"
        )
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
    on = report.get("gpu") or f"{m['cpu']} ({m['cores']} cores), {report['threads']} threads"
    ax.set_title(f"{report['model']}, {on}", fontsize=9)
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
    device: str = "cpu",
    random_weights: bool = False,
    prefix_cache_mb: int | None = None,
) -> int:
    report = run(models_dir, quick, tiny, threads, dtype, device, random_weights, prefix_cache_mb)
    print(render(report), flush=True)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2))
        print(f"json: {json_path}; plot: {write_plot(report, json_path.with_suffix('.png'))}", flush=True)
    return 0


def cli(argv: list[str] | None = None) -> int:
    """`python -m trajflow.lab.bench.batching`: the same, with no dependency beyond torch, transformers and pydantic
    when `--random-weights` (a lent GPU machine has no more)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m trajflow.lab.bench.batching", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here (and a plot)")
    parser.add_argument("--quick", action="store_true", help="fewer, shorter trajectories")
    parser.add_argument("--device", default="cpu", help="cpu (default), auto, cuda or cuda:N")
    parser.add_argument("--random-weights", action="store_true", help="SmolLM2's architecture, random weights")
    parser.add_argument("--dtype", default="auto", help="auto (the device's native choice), float32 or bfloat16")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the decode worker's)")
    parser.add_argument("--tiny", action="store_true", help="a tiny model: a smoke test, not a measurement")
    parser.add_argument(
        "--prefix-cache-mb", type=int, default=None, help="the engines' prefix cache (default: the config's; 0: none)"
    )
    args = parser.parse_args(argv)
    models_dir = Path.home() / ".trajflow" / "cache" / "models"
    if not args.random_weights:
        from trajflow.infra.settings import load_settings

        models_dir = load_settings().cache_dir / "models"
    return main(
        args.quick,
        args.json,
        models_dir,
        args.threads,
        args.tiny,
        args.dtype,
        args.device,
        args.random_weights,
        args.prefix_cache_mb,
    )


if __name__ == "__main__":
    sys.exit(cli())
