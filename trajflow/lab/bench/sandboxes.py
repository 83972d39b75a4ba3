"""`trajflow bench sandbox`: how fast and how robust the env sandboxes are on this machine.

Real parts only: the Docker engine, a `SandboxManager` made by `trajflow.workers.env.build_manager` from the process
settings (the env worker's limits, runtime image and step timeout), the `WarmPool`, and `env.reset` / `env.step`
/ `env.close` as the real activity code run by `temporalio.testing.ActivityEnvironment` (image resolution, pool
take, reset in the container; no Temporal server, so no round trip to one).

Figures, in the order they are measured (each phase prints progress and a line when it ends):
- cached_build_s: `ensure_runtime_image` + the env's image (`image_for_env`: hashes + exists) with every layer
  cached: what an env worker pays at start and on its first reset of the env (median of 5).
- warm_reset_ms: env.reset from a pre-filled warm pool, refilled before each sample, so every sample is a warm
  hit (`warm_hits` counts them) and no container starts meanwhile. cold_reset_ms: the same with the pool off: a
  container start from cached layers + reset; its target (≤ 1.5 s) is judged on the p50.
- steps_per_s: C sandboxes each stepping a cheap action in its own thread for T seconds, through what env.step
  runs in its thread (`manager.get`, which inspects the container, then `step`); total steps / elapsed.
- reset_success_rate: episodes (reset, 1 or 2 steps, close) through the activities, as many at once as the pool
  holds, while a `Killer` thread kills `kill_fraction` of the bench's containers, each chosen when first seen
  and killed after a random delay (starting, idle in the pool, mid-reset or mid-episode). An episode gets
  exactly a TrajectoryWorkflow's budget (`run_episode`): env.reset's retry policy (with Temporal's 1 s, 2 s
  waits, really waited), then `max_env_recoveries` fresh sandboxes with action replay. An env fault (ERR_ENV)
  there would be a bench bug, and is reported as one.
- layer_build_s: each layer built cold under throwaway `trajflow-bench-*` tags, wheels downloaded into a scratch
  cache; every image those builds made (intermediates included) is removed afterwards, the user's cached images
  are never touched. A layer not built cold (the base in --quick) is stood in for by a relabelled copy of the
  cached one, so Docker's build cache cannot serve the layers above it.

Not covered: the Temporal round trip per activity, several env workers or hosts. The "cold" wheel download may
still be served by pip's HTTP cache or the host's wheelhouse (PIP_FIND_LINKS).
Limits: ≥ 500 resets resolve the success rate to 0.2%, so 99.99% reads as "no failure in this run".
The episode budget, the Killer and the resets under kills are in `trajflow.lab.bench.sandboxes_chaos`, the cached-image
and layer-build figures in `trajflow.lab.bench.sandboxes_builds`, the summary and report in
`trajflow.lab.bench.sandboxes_report`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from trajflow.activities.env import EnvActivities
from trajflow.contracts.env_ids import SHELL_PREFIX
from trajflow.contracts.trajectory import (
    EnvCloseInput,
    EnvResetInput,
    EnvResetResult,
    EnvStepInput,
    EnvStepResult,
    SandboxHandle,
)
from trajflow.infra.settings import Settings
from trajflow.lab.bench.sandboxes_builds import measure_builds, measure_cached
from trajflow.lab.bench.sandboxes_chaos import measure_chaos
from trajflow.lab.bench.sandboxes_report import LAYERS, Figures, latency, percentile, render, summarize
from trajflow.sandbox import labels
from trajflow.sandbox.images import (
    ImageResolver,
    UnknownTask,
)
from trajflow.sandbox.manager import SandboxManager
from trajflow.sandbox.pool import WarmPool
from trajflow.workers.env import build_manager
from trajflow.workflows.stubs import ENV_FATAL

Say = Callable[[str], None]
DEFAULT_ENV = "shell:roman-numerals"
DEFAULT_POOL_SIZE = 4
"""The warm pool's size when the settings turn it off (TRAJFLOW_SANDBOX_WARM_POOL=0)."""


@dataclass(frozen=True)
class Plan:
    """What to measure and how much; `quick_plan` is the smoke-run variant."""

    env_id: str = DEFAULT_ENV
    action: str | None = None
    """The cheap action stepped everywhere; None: `echo hi` for a shell task, else a GEM-style `\\boxed{5}`."""
    quick: bool = False
    warm_samples: int = 100
    cold_samples: int = 30
    concurrency: int = 16
    step_seconds: float = 20.0
    chaos_resets: int = 500
    kill_fraction: float = 0.1
    kill_span_s: float = 1.0
    """A kill lands uniformly in [0, span] after its container appears; span is this until the killer has seen 5
    containers go, then their median lifetime (see `Killer`)."""
    cold_layers: tuple[str, ...] = LAYERS
    seed: int = 0

    def describe(self) -> str:
        skipped = ", ".join(layer for layer in LAYERS if layer not in self.cold_layers)
        return (
            f"bench sandbox on env {self.env_id!r}{' (--quick)' if self.quick else ''}: {self.warm_samples} warm + "
            f"{self.cold_samples} cold resets, {self.concurrency} sandboxes stepping {self.step_seconds:g} s, "
            f"{self.chaos_resets} resets with {self.kill_fraction:.0%} of containers killed; cold layer builds: "
            f"{', '.join(self.cold_layers) or 'none'}" + (f" (not built cold: {skipped})" if skipped else "")
        )

    @property
    def step_action(self) -> str:
        return self.action or ("echo hi" if self.env_id.startswith(SHELL_PREFIX) else "\\boxed{5}")


def quick_plan(**overrides: Any) -> Plan:
    """A smoke run in a minute or two on a 2-core machine: small N, no cold base build (debootstrap is slow)."""
    fields: dict[str, Any] = {
        "quick": True,
        "warm_samples": 10,
        "cold_samples": 5,
        "concurrency": 4,
        "step_seconds": 3.0,
        "chaos_resets": 40,
        "cold_layers": ("runtime", "task"),
    }
    return Plan(**{**fields, **overrides})


# --- the real parts --------------------------------------------------------------------------------------------


class BenchInputError(ValueError):
    """The env (or its action) cannot run at all: a usage error, not a figure."""


class ActivityOps:
    """EpisodeOps through the real activity code (env.reset, env.step, env.close), run by ActivityEnvironment."""

    def __init__(self, acts: EnvActivities, env_id: str, seed: int) -> None:
        self.acts, self.env_id, self.seed = acts, env_id, seed
        self.env = ActivityEnvironment()

    async def reset(self, replay: list[str]) -> EnvResetResult:
        tid = f"bench-{uuid.uuid4().hex[:8]}"
        inp = EnvResetInput(trajectory_id=tid, env_id=self.env_id, seed=self.seed, replay_actions=replay)
        result: EnvResetResult = await self.env.run(self.acts.reset, inp)
        return result

    async def step(self, handle: SandboxHandle, action: str) -> EnvStepResult:
        result: EnvStepResult = await self.env.run(self.acts.step, EnvStepInput(handle=handle, action=action))
        return result

    async def close(self, handle: SandboxHandle) -> None:
        await self.env.run(self.acts.close, EnvCloseInput(handle=handle))


@dataclass
class Rig:
    """The bench's own env worker: its manager and image resolver, the env's image, the warm pool's size."""

    plan: Plan
    manager: SandboxManager
    images: ImageResolver
    cache_dir: Path
    image: str
    pool_size: int
    step_timeout_s: float

    def ops(self, pool: WarmPool) -> ActivityOps:
        owner = self.manager.owner_id
        acts = EnvActivities(self.manager, "bench", owner, self.step_timeout_s, warm=pool, images=self.images)
        return ActivityOps(acts, self.plan.env_id, self.plan.seed)

    def fill(self, pool: WarmPool) -> None:
        timeout_s = (pool.size + 1) * self.manager.start_timeout_s
        if not pool.wait_full(self.plan.env_id, self.image, timeout_s=timeout_s):
            raise RuntimeError(f"the warm pool did not fill within {timeout_s:g} s ({pool.stats})")


def prepare(settings: Settings, plan: Plan, say: Say) -> Rig:
    """The env worker's manager (`build_manager`: reaps orphans, finds or builds the runtime image) and the env's
    image (built if missing, as an env worker does on the env's first reset)."""
    say("preparing: the env worker's sandbox manager and the env's image (built if missing: minutes the first time)")
    manager = build_manager(settings, f"bench-{uuid.uuid4().hex[:8]}")
    cache_dir = settings.cache_dir / "images"
    images = ImageResolver(manager.client, cache_dir)
    image = images.image_for(plan.env_id)
    pool_size = settings.sandbox_warm_pool or DEFAULT_POOL_SIZE
    say(f"env {plan.env_id!r} runs on {image}; warm pool size {pool_size}; owner {manager.owner_id}")
    return Rig(plan, manager, images, cache_dir, image, pool_size, settings.sandbox_step_timeout_s)


async def probe(rig: Rig) -> None:
    """One reset and step before measuring: fails fast on an env that cannot run, and warms the page cache."""
    pool = WarmPool(rig.manager, 0)
    ops = rig.ops(pool)
    try:
        res = await ops.reset([])
        try:
            await ops.step(res.handle, rig.plan.step_action)
        finally:
            await ops.close(res.handle)
    except ApplicationError as e:
        if e.type in ENV_FATAL:
            raise BenchInputError(f"env {rig.plan.env_id!r} cannot run: {e}") from e
        raise
    finally:
        pool.close()


async def _timed_resets(
    ops: ActivityOps, n: int, label: str, say: Say, before: Callable[[], None] | None
) -> list[float]:
    samples: list[float] = []
    for i in range(n):
        if before is not None:
            await asyncio.to_thread(before)
        t0 = time.perf_counter()
        res = await ops.reset([])
        samples.append((time.perf_counter() - t0) * 1000)
        await ops.close(res.handle)
        if (i + 1) % max(1, n // 5) == 0 and i + 1 < n:
            say(f"  {label} resets: {i + 1}/{n}, p50 so far {percentile(samples, 50):.1f} ms")
    figures = latency(samples)
    say(f"{label} resets: {n} samples, p50 {figures['p50']:.1f} ms, p99 {figures['p99']:.1f} ms")
    return samples


async def measure_warm(rig: Rig, say: Say) -> tuple[list[float], int]:
    """env.reset from a full warm pool, refilled before every sample; returns the samples and the warm hits."""
    pool = WarmPool(rig.manager, rig.pool_size)
    try:
        say(f"warm resets: filling a warm pool of {rig.pool_size}")
        samples = await _timed_resets(rig.ops(pool), rig.plan.warm_samples, "warm", say, lambda: rig.fill(pool))
        return samples, pool.stats.warm_hits
    finally:
        pool.close()


async def measure_cold(rig: Rig, say: Say) -> list[float]:
    """env.reset with the warm pool off: a container start from cached layers, then the reset."""
    pool = WarmPool(rig.manager, 0)
    try:
        return await _timed_resets(rig.ops(pool), rig.plan.cold_samples, "cold", say, None)
    finally:
        pool.close()


def measure_steps(rig: Rig, say: Say) -> dict[str, Any]:
    """C sandboxes stepping the plan's action, each in its own thread, for T seconds: steps per second in all."""
    plan, manager = rig.plan, rig.manager
    kwargs: dict[str, Any] = {"max_turns": 10**6} if plan.env_id.startswith(SHELL_PREFIX) else {}
    say(f"steps: starting {plan.concurrency} sandboxes")
    boxes = []
    stop = threading.Event()
    try:
        with ThreadPoolExecutor(max_workers=min(plan.concurrency, 4)) as pool:
            boxes = list(pool.map(lambda _: manager.start(plan.env_id, rig.image), range(plan.concurrency)))
        for box in boxes:
            box.reset(plan.env_id, plan.seed, kwargs)
        counts = [0] * len(boxes)
        errors: list[str] = []
        go = threading.Barrier(len(boxes) + 1)

        def drive(i: int) -> None:
            go.wait()
            try:
                while not stop.is_set():
                    out = manager.get(boxes[i].id).step(plan.step_action)  # what env.step runs in its thread
                    counts[i] += 1
                    if out["terminated"] or out["truncated"]:
                        boxes[i].reset(plan.env_id, plan.seed, kwargs)
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}")

        threads = [
            threading.Thread(target=drive, args=(i,), name=f"bench-steps-{i}", daemon=True) for i in range(len(boxes))
        ]
        for t in threads:
            t.start()
        go.wait()
        t0 = time.monotonic()
        deadline = t0 + plan.step_seconds
        while (left := deadline - time.monotonic()) > 0:
            stop.wait(min(left, 5.0))  # an interruptible sleep: the threads are stepping meanwhile
            if time.monotonic() < deadline:
                say(f"  steps: {sum(counts)} after {time.monotonic() - t0:.0f} s")
        stop.set()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        for box in boxes:
            manager.close(box.id)
    total = sum(counts)
    say(f"steps: {total} in {elapsed:.1f} s with {len(boxes)} sandboxes -> {total / elapsed:.1f} steps/s")
    return {
        "steps_per_s": total / elapsed,
        "concurrency": len(boxes),
        "seconds": elapsed,
        "total": total,
        "per_sandbox": counts,
        "action": plan.step_action,
        "errors": errors[:5],
    }


# --- the run -----------------------------------------------------------------------------------------------------


def _remove_leftovers(manager: SandboxManager) -> int:
    """Remove any container of this bench's owner still there after close_all (a bug if there is one)."""
    left = manager.client.containers.list(all=True, filters={"label": f"{labels.OWNER}={manager.owner_id}"})
    for container in left:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            continue
    return len(left)


def run_bench(plan: Plan, settings: Settings, say: Say) -> dict[str, Any]:
    """Measure everything, closing every container and removing every image the bench made, even on Ctrl-C."""
    started, load_start = time.monotonic(), os.getloadavg()[0]
    say(plan.describe())
    rig = prepare(settings, plan, say)
    try:
        asyncio.run(probe(rig))
        cached = measure_cached(rig.manager.client, rig.cache_dir, plan.env_id)
        say(f"images with every layer cached: {cached['cached_build_s'] * 1000:.0f} ms")
        warm_ms, warm_hits = asyncio.run(measure_warm(rig, say))
        cold_ms = asyncio.run(measure_cold(rig, say))
        steps = measure_steps(rig, say)
        chaos = asyncio.run(measure_chaos(rig, say))
        builds = measure_builds(rig.manager.client, rig.cache_dir, rig.manager.image, plan, say)
    finally:
        rig.manager.close_all()
        leftovers = _remove_leftovers(rig.manager)
    machine = {"cpus": float(os.cpu_count() or 0), "loadavg_1m_start": load_start, "loadavg_1m_end": os.getloadavg()[0]}
    return summarize(
        Figures(
            plan=plan,
            owner=rig.manager.owner_id,
            image=rig.image,
            pool_size=rig.pool_size,
            cached=cached,
            warm_ms=warm_ms,
            warm_hits=warm_hits,
            cold_ms=cold_ms,
            steps=steps,
            chaos=chaos,
            builds=builds,
            machine=machine,
            leftover_containers=leftovers,
            wall_s=time.monotonic() - started,
        )
    )


def main(plan: Plan, json_path: Path | None, settings: Settings) -> int:
    """Run the bench, print the report (stdout) after progress lines (stderr), write the JSON; 2 on bad input,
    1 when the bench itself misbehaved (env faults under kills, containers that outlived the bench)."""
    t0 = time.monotonic()
    # The kills make the warm pool discard dead sandboxes and retry refills, logging each: expected here, and
    # counted in the report.
    logging.getLogger("trajflow.sandbox.pool").setLevel(logging.ERROR)

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f} s] {msg}", file=sys.stderr, flush=True)

    try:
        summary = run_bench(plan, settings, say)
    except (BenchInputError, UnknownTask) as e:
        say(f"error: {e}")
        return 2
    except docker.errors.DockerException as e:
        say(f"error: Docker: {e}")
        return 2
    print(render(summary), flush=True)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(summary, indent=2))
        say(f"wrote {json_path}")
    return 1 if summary["chaos"]["env_faults"] or summary["leftover_containers"] else 0
