"""What the verifiers' time limit costs per call: a reward function called in the caller's thread (as the reward
service did before `trajflow.rewards.bounded`) against the same call through a `BoundedRunner` (a reused worker
process: one pipe round trip, the request and result pickled), side by side in one run.

`python -m trajflow.lab.bench.verifiers [--calls N] [--json PATH]`: for `math_verify` (a right and a wrong answer,
alternating, Math-Verify parsing both sides) and `exact_match` (where the round trip is nearly all of the cost), the
median and mean seconds per call each way, the median time the function itself took inside the worker (after
warm-up calls, which start the worker; the two ways interleaved call by call), and their ratio.

Limits: one caller at a time (no concurrency); one machine and whatever else runs on it (the load average is
reported); the reward service's HTTP handling around a call (about a millisecond) is not included, so the ratio is
the worst case a request can see.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from trajflow.contracts.scoring import ScoreRequest, ScoreResult
from trajflow.contracts.trajectory import JsonScalar
from trajflow.lab.bench.real_report import machine
from trajflow.rewards import registry
from trajflow.rewards.bounded import BoundedRunner


def _requests(reward_fn: str) -> list[ScoreRequest]:
    answers = ["\\boxed{\\frac{1}{2}}", "\\boxed{0.25}"]
    info: dict[str, JsonScalar] = {"answer": "0.5"}
    return [ScoreRequest(env_id="data:bench", reward_fn=reward_fn, actions=[a], final_info=info) for a in answers]


def _timed(fn: Callable[[ScoreRequest], ScoreResult], req: ScoreRequest) -> float:
    """Runs in the worker: the seconds `fn(req)` takes there, without the round trip."""
    start = time.perf_counter()
    fn(req)
    return time.perf_counter() - start


def _through(
    runner: BoundedRunner, name: str, fn: Callable[[ScoreRequest], ScoreResult], inside: list[float]
) -> Callable[[ScoreRequest], object]:
    """`fn` through the runner; appends the seconds it took inside the worker to `inside`."""
    return lambda req: inside.append(runner.call(name, _timed, fn, req))


def _time(ways: list[Callable[[ScoreRequest], object]], reqs: list[ScoreRequest], calls: int) -> list[list[float]]:
    """Seconds per call of each way, the ways interleaved call by call, so a change in the machine's load between
    them shows in both."""
    for call in ways:
        for req in reqs:  # warm-up: imports, the worker's start
            call(req)
    seconds: list[list[float]] = [[] for _ in ways]
    for i in range(calls):
        for call, out in zip(ways, seconds, strict=True):
            start = time.perf_counter()
            call(reqs[i % len(reqs)])
            out.append(time.perf_counter() - start)
    return seconds


def measure(calls: int) -> dict[str, object]:
    runner = BoundedRunner(timeout_s=5.0, processes=1, preload=["math_verify"])
    rows = {}
    try:
        for name in ("math_verify", "exact_match"):
            fn = registry.get(name)
            reqs = _requests(name)
            inside: list[float] = []
            thread, bounded = _time([fn, _through(runner, name, fn, inside)], reqs, calls)
            inside = inside[len(reqs) :]  # the warm-up calls' out
            rows[name] = {
                "thread_median_s": statistics.median(thread),
                "thread_mean_s": statistics.fmean(thread),
                "bounded_median_s": statistics.median(bounded),
                "bounded_mean_s": statistics.fmean(bounded),
                "in_worker_median_s": statistics.median(inside),
                "ratio_median": statistics.median(bounded) / statistics.median(thread),
                "overhead_median_s": statistics.median(bounded) - statistics.median(thread),
            }
    finally:
        runner.close()
    return {"calls": calls, "machine": machine(), "loadavg": os.getloadavg(), "verifiers": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m trajflow.lab.bench.verifiers", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--calls", type=int, default=300, help="timed calls per verifier and way (default 300)")
    parser.add_argument("--json", type=Path, default=None, help="also write the result as JSON to this file")
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error("--calls must be at least 1")
    result = measure(args.calls)
    for name, row in result["verifiers"].items():  # type: ignore[union-attr]
        print(
            f"{name:12s} thread {row['thread_median_s'] * 1e3:7.3f} ms  bounded {row['bounded_median_s'] * 1e3:7.3f} ms"
            f"  ratio {row['ratio_median']:5.2f}x  (+{row['overhead_median_s'] * 1e6:.0f} us; in the worker "
            f"{row['in_worker_median_s'] * 1e3:.3f} ms; medians)"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
