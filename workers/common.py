"""What every worker process shares: its id, logging, its traced client, and running Temporal workers until a
signal."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import uuid
from collections.abc import Awaitable, Callable, Sequence

from temporalio.client import Client
from temporalio.worker import Worker

from trajflow.infra.settings import Settings
from trajflow.infra.temporal import wait_until_reachable
from trajflow.observability import tracing

log = logging.getLogger("trajflow.worker")


class WorkerStopped(RuntimeError):
    """A Temporal worker of this process stopped without being asked to."""


def new_worker_id() -> str:
    """Unique per process start: a restarted worker gets a new host queue, so stale steps time out."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def connect_worker(settings: Settings, role: str) -> Client:
    """The worker's client once the server answers, tracing its trajectories' activities when the settings say so
    (`trajflow.observability.tracing`: OTLP or a JSON-lines file under the state dir)."""
    where = tracing.configure(settings.traces, settings.otlp_endpoint, settings.traces_dir, role)
    if where is not None:
        log.info("traces to %s", where)
    return await wait_until_reachable(settings, plugins=tracing.plugins())


def configure_logging(name: str) -> None:
    logging.basicConfig(
        level=os.environ.get("TRAJFLOW_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
    )


async def run_until_signalled(
    workers: Sequence[Worker],
    on_stop: Callable[[], Awaitable[None]] | None = None,
    stop_when: asyncio.Event | None = None,
) -> None:
    """Run the workers until SIGTERM/SIGINT (or until `stop_when` is set), then shut them down gracefully and
    call on_stop. A Temporal worker that stops on its own (e.g. its start-up check of the namespace failed) stops
    the others too, and then `WorkerStopped` is raised: the process exits non-zero with the cause, not 0."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(w.run()) for w in workers]
    for w in workers:
        log.info("polling %s", w.task_queue)
    waiters = [asyncio.create_task(event.wait()) for event in (stop, stop_when) if event is not None]
    done, _ = await asyncio.wait([*waiters, *tasks], return_when=asyncio.FIRST_COMPLETED)
    failure = next((t.exception() for t in done if t not in waiters and t.exception() is not None), None)
    if failure is not None:
        log.error("worker stopped: %r", failure)
    for waiter in waiters:
        waiter.cancel()
    await asyncio.gather(*(w.shutdown() for w in workers), return_exceptions=True)
    tracing.flush()  # the CLI ends worker processes with os._exit: no exit handler would export the last spans
    if on_stop is not None:
        await on_stop()
    if failure is not None:
        raise WorkerStopped(f"a worker stopped on its own: {failure!r}") from failure
