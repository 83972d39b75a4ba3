"""`trajflow bench reward-model`: what batching buys a local reward model (`trajflow/rewards/models/`), side by side in
one run.

The server (`python -m trajflow.rewards.models.server`, the process `trajflow reward-model serve` runs) is started once
per setting, `--max-batch 1` and then `--max-batch B`, on SmolLM2-135M-Instruct as a yes/no verifier (the tiny random
model with `--quick`). Each gets one warm-up request, then `--requests` N requests at once: the prompts and reference
answers of arithmetic problems like the example dataset's (`examples/arithmetic/chain_sum.jsonl`: sums and
differences of two to four numbers of one or two digits), drawn from a fixed seed, every other one answered right.
Reported per setting: seconds, requests/s and the batch sizes the server formed (its `/healthz`); then the ratio of
the two rates, and the largest difference between the two settings' rewards for the same request (batching pads
the shorter prompts; the rewards must not change beyond float32 noise, `MAX_REWARD_GAP`).

Limits: one machine and whatever else runs on it (the load average before and after is reported); requests sent all
at once (a training run's reward calls arrive spread over time, so its batches are smaller); CPU float32 unless
the machine runs bf16 natively (the server's own choice).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trajflow.infra.processes import python_module
from trajflow.lab.bench.real_report import machine
from trajflow.lab.bench.stack import stop_process, wait_healthy

MAX_REWARD_GAP = 1e-3
"""The most a request's reward may differ between batch 1 and batched (float32, padded prompts)."""
START_S = 300.0


def problem(rng: random.Random) -> tuple[str, int]:
    """An arithmetic prompt in the example dataset's wording, and its answer."""
    terms = [rng.randint(1, 99 if rng.random() < 0.5 else 9) for _ in range(rng.randint(2, 4))]
    signs = [rng.choice("+-") for _ in terms[1:]]
    text = " ".join([str(terms[0]), *(f"{s} {t}" for s, t in zip(signs, terms[1:], strict=True))])
    answer = terms[0] + sum(t if s == "+" else -t for s, t in zip(signs, terms[1:], strict=True))
    return (
        f"State the final answer to the following arithmetic problem: {text} = Put the final answer in \\boxed{{}}.",
        answer,
    )


def requests(n: int, seed: int = 0) -> list[dict[str, str]]:
    """N scoring requests: every other one with the right answer, the rest off by one."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt, right = problem(rng)
        answer = right + (0 if i % 2 == 0 else 1)
        out.append({"prompt": prompt, "response": f"\\boxed{{{answer}}}", "reference": str(right)})
    return out


async def _measure(model: str, max_batch: int, bodies: list[dict[str, str]], port: int, say: Any) -> dict[str, Any]:
    import httpx

    argv = python_module(
        "trajflow.rewards.models.server",
        "--model",
        model,
        "--port",
        str(port),
        "--max-batch",
        str(max_batch),
        "--max-wait-ms",
        "20",
    )
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_healthy(proc, url, START_S, "the reward-model server")
        async with httpx.AsyncClient(timeout=600) as http:
            await http.post(f"{url}/score", json=bodies[0])  # warm-up: first-call costs out of the figure
            started = time.monotonic()
            answers = await asyncio.gather(*(http.post(f"{url}/score", json=b) for b in bodies))
            seconds = time.monotonic() - started
            bad = [a.status_code for a in answers if a.status_code != 200]
            if bad:
                raise RuntimeError(f"the server answered {bad[:5]} to some requests")
            health = (await http.get(f"{url}/healthz")).json()
    finally:
        stop_process(proc)
    sizes = dict(health["batch_sizes"])
    sizes["1"] = sizes.get("1", 0) - 1  # the warm-up
    result = {
        "max_batch": max_batch,
        "seconds": round(seconds, 3),
        "requests_per_s": round(len(bodies) / seconds, 2),
        "batch_sizes": {k: v for k, v in sizes.items() if v},
        "rewards": [a.json()["reward"] for a in answers],
    }
    say(
        f"max-batch {max_batch}: {len(bodies)} requests in {seconds:.2f} s, {result['requests_per_s']} requests/s, "
        f"batches {result['batch_sizes']}"
    )
    return result


def main(quick: bool, json_path: Path | None, n: int, max_batch: int, port: int) -> int:
    """Run both settings, print the figures (and write them as JSON); 1 if the rewards differ, else 0."""

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    model = "tiny" if quick else "smollm2"
    bodies = requests(n)
    load_before = os.getloadavg()
    one = asyncio.run(_measure(model, 1, bodies, port, say))
    batched = asyncio.run(_measure(model, max_batch, bodies, port, say))
    gap = max(abs(a - b) for a, b in zip(one["rewards"], batched["rewards"], strict=True))
    report = {
        "machine": machine() | {"load_before": load_before, "load_after": os.getloadavg()},
        "model": model,
        "requests": n,
        "batch_1": {k: v for k, v in one.items() if k != "rewards"},
        "batched": {k: v for k, v in batched.items() if k != "rewards"},
        "speedup": round(batched["requests_per_s"] / one["requests_per_s"], 2),
        "max_reward_gap": gap,
        "same_rewards": gap <= MAX_REWARD_GAP,
    }
    print(
        f"batching (max-batch {max_batch}) over max-batch 1: {report['speedup']}x requests/s; "
        f"largest reward difference {gap:.2g} ({'same' if report['same_rewards'] else 'DIFFERENT'})"
    )
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if report["same_rewards"] else 1
