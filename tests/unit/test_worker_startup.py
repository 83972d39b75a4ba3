"""What keeps a worker process from dying quietly at start-up: the reaper skips a sandbox the engine fails to
remove instead of raising (an env worker reaps before it polls), a Temporal worker that stops on its own ends
the process with an error instead of exit code 0, and `up` starts a worker that exited during start-up once more
before it reports it with its log (real processes).

Small stand-ins for the Docker client and the Temporal worker: these test the code around them (what it does when
they fail), not Docker or Temporal."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, cast

import docker.errors
import pytest
import requests

from trajflow.infra.processes import ProcessTable, is_alive, start_detached, stop
from trajflow.infra.stack import start_up_watch
from trajflow.sandbox import labels
from trajflow.sandbox.reaper import reap_orphans
from trajflow.workers.common import WorkerStopped, run_until_signalled


class Container:
    def __init__(self, cid: str, failure: Exception | None = None) -> None:
        self.id = self.name = cid
        self.failure = failure
        self.removed = False
        # an owner pid that does not exist: an orphan
        self.labels = {labels.SANDBOX: "1", labels.OWNER_PID: str(2**22 + 7), labels.OWNER_START: "1"}

    def remove(self, force: bool) -> None:
        if self.failure is not None:
            raise self.failure
        self.removed = True


class Engine:
    def __init__(self, containers: list[Container]) -> None:
        self.containers = self
        self.listed = containers

    def list(self, **_: Any) -> list[Container]:
        return self.listed


def test_the_reaper_skips_a_sandbox_the_engine_fails_to_remove_and_reaps_the_rest() -> None:
    busy = Container("busy", requests.exceptions.ReadTimeout("read timed out (60 s)"))
    broken = Container("broken", docker.errors.APIError("500 Server Error", explanation="driver failed"))
    gone = Container("gone", docker.errors.NotFound("no such container"))
    orphan = Container("orphan")
    assert labels.owner_alive(orphan.labels, "") is False  # the premise: an orphan by its labels

    reaped = reap_orphans(cast(Any, Engine([busy, broken, gone, orphan])))

    assert reaped == ["orphan"] and orphan.removed


class Worker:
    def __init__(self, queue: str, fails: bool) -> None:
        self.task_queue = queue
        self.fails = fails
        self.stopped = asyncio.Event()

    async def run(self) -> None:
        if self.fails:
            raise RuntimeError("Worker validation failed: namespace check timed out")
        await self.stopped.wait()

    async def shutdown(self) -> None:
        self.stopped.set()


async def test_a_worker_that_stops_on_its_own_stops_the_rest_and_raises() -> None:
    healthy, failing = Worker("q-ok", fails=False), Worker("q-bad", fails=True)
    stopped: list[bool] = []

    async def on_stop() -> None:
        stopped.append(True)

    with pytest.raises(WorkerStopped, match="namespace check timed out"):
        await asyncio.wait_for(run_until_signalled(cast(Any, [healthy, failing]), on_stop=on_stop), timeout=30)
    assert healthy.stopped.is_set() and stopped == [True]


async def test_workers_asked_to_stop_return_normally() -> None:
    worker = Worker("q", fails=False)
    stop = asyncio.Event()
    stop.set()
    await asyncio.wait_for(run_until_signalled(cast(Any, [worker]), stop_when=stop), timeout=30)
    assert worker.stopped.is_set()


def test_the_fake_owner_pid_is_not_running() -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(2**22 + 7, 0)


def _started(tmp_path: Path, name: str, script: str) -> None:
    """A process of `up`'s table: a shell script started detached, recorded under tmp_path/run. It lives half a
    second before the script runs, as a worker does while it starts: `start_detached` refuses to record a process
    that is gone before it reads its start time."""
    rec = start_detached(name, ["sh", "-c", f"sleep 0.5; {script}"], tmp_path / "logs")
    ProcessTable(tmp_path / "run").add(rec)


def _wait_exited(table: ProcessTable, name: str) -> None:
    rec = next(r for r in table.load() if r.name == name)
    deadline = time.monotonic() + 30
    while is_alive(rec):
        assert time.monotonic() < deadline, f"{name} did not exit"
        time.sleep(0.05)


def test_start_up_starts_a_worker_that_exited_again_once_then_reports_its_log(tmp_path: Path) -> None:
    flag = tmp_path / "started-once"
    # exits the first time (a transient failure), lives the second time
    _started(
        tmp_path, "flaky", f"if [ -e {flag} ]; then exec sleep 60; else touch {flag}; echo first try failed; exit 3; fi"
    )
    _started(tmp_path, "broken", "echo cannot start; exit 4")
    table = ProcessTable(tmp_path / "run")
    for name in ("flaky", "broken"):
        _wait_exited(table, name)
    said: list[str] = []
    check = start_up_watch(tmp_path / "run", tmp_path / "logs", said.append)

    with pytest.raises(RuntimeError, match="broken exited during start-up") as failed:
        for _ in range(100):
            check()
            time.sleep(0.1)
    flaky = next(r for r in table.load() if r.name == "flaky")
    try:
        assert is_alive(flaky), "the flaky worker's second start should be running"
        assert "cannot start" in str(failed.value)  # the end of its log, in the error
        assert any("flaky: exited during start-up" in s and "first try failed" in s for s in said)
        assert any("broken: exited during start-up, starting it again" in s for s in said)  # once, then the error
    finally:
        stop(flaky)
