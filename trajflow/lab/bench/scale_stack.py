"""The stack of `trajflow bench scale`: the Temporal dev server (in memory), the reward service, and one worker process
per role (`trajflow.lab.bench.scale_workers`), all ended by PID when the bench ends; plus reading CPU seconds of
processes.

Not covered: Docker sandboxes, real models, a persistent database; see `trajflow.lab.bench.scale`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.client import Client

from trajflow.contracts import names
from trajflow.infra.processes import python_module
from trajflow.lab.bench.cpu_use import stat_fields
from trajflow.lab.bench.scale_workers import ROLES
from trajflow.lab.bench.stack import child_output_to_devnull, quiet_runtime, start_reward_service, stop_process


@dataclass
class ScaleStack:
    client: Client
    queue: str
    pool: str
    traces_dir: Path
    pids: dict[str, int] = field(default_factory=dict)
    """Process by role: the four workers, `server`, `reward_service` and `driver` (this one)."""


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (0 when it is gone)."""
    try:
        return stat_fields(Path(f"/proc/{pid}/stat").read_text())[1]
    except OSError:
        return 0.0


def server_pid() -> int | None:
    """The dev server this process started (a child running `temporal server start-dev`)."""
    me = str(os.getpid())
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if stat[1] == me and b"start-dev" in cmd:
            return int(proc.name)
    return None


def _alive(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """Raises when a bench worker has exited (it would never poll)."""
    dead = [role for role, p in procs.items() if p.poll() is not None]
    if dead:
        raise RuntimeError(f"bench worker(s) {dead} exited at start")


@asynccontextmanager
async def scale_stack(
    cache_dir: Path,
    say: Callable[[str], None],
    *,
    decode_s: float,
    trace_share: float,
    slots: int,
    workflow_cache: int | None,
) -> AsyncIterator[ScaleStack]:
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.testing import WorkflowEnvironment

    from trajflow.infra.stack import wait_for_queues
    from trajflow.infra.temporal import dev_server_args, temporal_binary

    shm = Path("/dev/shm")
    work = Path(tempfile.mkdtemp(prefix="trajflow-scale-", dir=shm if shm.is_dir() else None))
    traces = work / "traces"
    traces.mkdir()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    reward_proc: subprocess.Popen[bytes] | None = None
    env: WorkflowEnvironment | None = None
    try:
        with child_output_to_devnull():
            env = await WorkflowEnvironment.start_local(
                data_converter=pydantic_data_converter,
                dev_server_existing_path=temporal_binary(),
                dev_server_extra_args=dev_server_args(),
                dev_server_log_level="error",
                runtime=quiet_runtime(),
            )
        reward_proc, reward_url = await start_reward_service()
        tag = uuid.uuid4().hex[:8]
        pool, queue = f"scale{tag}", f"trajflow-scale-{tag}"
        common = [
            "--address",
            env.client.service_client.config.target_host,
            "--queue",
            queue,
            "--pool",
            pool,
            "--store",
            str(work),
            "--traces",
            str(traces),
            "--trace-share",
            str(trace_share),
            "--decode-s",
            str(decode_s),
            "--slots",
            str(slots),
            "--activity-slots",
            str(slots),
            "--reward-url",
            reward_url,
            "--cache-dir",
            str(cache_dir),
        ]
        if workflow_cache is not None:
            common += ["--workflow-cache", str(workflow_cache)]
        log = (work / "workers.log").open("ab")
        for role in ROLES:
            argv = python_module("trajflow.lab.bench.scale_workers", role, *common)
            procs[role] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        await wait_for_queues(
            env.client,
            [
                (queue, False),
                (names.decode_queue(pool), True),
                (names.env_queue(pool), True),
                (names.reward_queue(pool), True),
            ],
            progress=lambda _line: None,
            deadline=time.monotonic() + 120.0,
            check=lambda: _alive(procs),
            who="bench worker",
        )
        server = server_pid()
        pids = {role: p.pid for role, p in procs.items()} | {"reward_service": reward_proc.pid, "driver": os.getpid()}
        if server is not None:
            pids["server"] = server
        say(
            f"stack up: dev server, reward service and {len(procs)} worker processes ({', '.join(procs)}) on pool "
            f"{pool}"
        )
        yield ScaleStack(env.client, queue, pool, traces, pids)
    finally:
        for p in procs.values():
            stop_process(p)
        if reward_proc is not None:
            stop_process(reward_proc)
        if env is not None:
            await env.shutdown()
        if os.environ.get("TRAJFLOW_BENCH_KEEP") is None:
            shutil.rmtree(work, ignore_errors=True)
        else:
            say(f"kept {work} (TRAJFLOW_BENCH_KEEP)")
