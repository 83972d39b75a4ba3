"""Ends the trajectories that a training run left running: the orchestrator worker's periodic sweep.

A cancelled training run cancels its trajectories itself, but a terminated one runs no code, and trajectories
are abandoned children (they outlive continue-as-new). So every `run_sweep_s` seconds the orchestrator lists the
running trajectories (and a sharded run's shard workflows, `workflows/shard.py`) that carry a run id
(`TrajflowRun`), asks Temporal how each run's training workflow is, and cancels the trajectories of a run that
ended early: terminated, cancelled, failed or timed out. Trajectories of a running or completed run are left alone,
and so are those whose run id names no training workflow (rollouts a user grouped under an id).

Each round pages through every running trajectory whose run is not running (`page` a request), so the trajectories of
a live run, however many, never hide those of one that ended (the sweep once read the first 1,000 running
trajectories of every run, and a run with more in flight filled them). Idempotent, so several orchestrator workers
may sweep at once. Visibility is eventually consistent, so a trajectory started as the run ended may need a second
round.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import SearchAttributeKey
from temporalio.service import RPCError, RPCStatusCode

from trajflow.contracts import names
from trajflow.contracts.metrics import RUN_SWEEP_CANCELLED
from trajflow.infra.temporal import execution_status
from trajflow.observability.metrics import meter_of, record

log = logging.getLogger("trajflow.run_sweep")

ENDED_EARLY = frozenset(
    {
        WorkflowExecutionStatus.TERMINATED,
        WorkflowExecutionStatus.CANCELED,
        WorkflowExecutionStatus.FAILED,
        WorkflowExecutionStatus.TIMED_OUT,
    }
)
"""How a training run's newest execution ended, for which its running trajectories are cancelled."""

_RUN = SearchAttributeKey.for_keyword(names.SA_RUN)

RUNNING_TRAJECTORIES = (
    f"WorkflowType IN ('{names.TRAJECTORY_WORKFLOW}', '{names.SHARD_WORKFLOW}') AND ExecutionStatus = 'Running' "
    f"AND {names.SA_RUN} IS NOT NULL"
)
"""Trajectories, and the shard workflows of sharded runs (their parents), that carry a run id."""


RUNNING_RUNS = f"WorkflowType = '{names.TRAINING_WORKFLOW}' AND ExecutionStatus = 'Running'"


async def running_runs(client: Client, page: int = 1000) -> set[str]:
    """The ids of the training runs that are running (every page)."""
    return {wf.id async for wf in client.list_workflows(RUNNING_RUNS, page_size=page)}


def orphans_query(running: set[str]) -> str:
    """`RUNNING_TRAJECTORIES` less those of the `running` runs (all of them when an id cannot be quoted)."""
    quotable = sorted(r for r in running if "'" not in r and "\\" not in r)
    if not quotable or len(quotable) < len(running):
        return RUNNING_TRAJECTORIES
    listed = ", ".join(f"'{r}'" for r in quotable)
    return f"{RUNNING_TRAJECTORIES} AND {names.SA_RUN} NOT IN ({listed})"


async def running_by_run(client: Client, page: int = 1000) -> dict[str, list[str]]:
    """Run id -> workflow ids of its running trajectories, for every run id that names no running training run:
    all of them, `page` a request."""
    out: dict[str, list[str]] = defaultdict(list)
    running = await running_runs(client, page)
    async for wf in client.list_workflows(orphans_query(running), page_size=page):
        run = wf.typed_search_attributes.get(_RUN)
        if run and run not in running:
            out[run].append(wf.id)
    return dict(out)


async def sweep_once(client: Client, page: int = 1000) -> dict[str, int]:
    """One round: run id -> trajectories cancelled, for the runs that ended early."""
    cancelled: dict[str, int] = {}
    for run, workflow_ids in (await running_by_run(client, page)).items():
        status = await execution_status(client, run)  # None: no training workflow of that id
        if status not in ENDED_EARLY:
            continue
        for wid in workflow_ids:
            try:
                await client.get_workflow_handle(wid).cancel()
            except RPCError as e:
                if e.status is not RPCStatusCode.NOT_FOUND:  # NOT_FOUND: it closed meanwhile
                    raise
            cancelled[run] = cancelled.get(run, 0) + 1
        log.warning(
            "run %s ended (%s) with %d trajectories running: cancelled them",
            run,
            status.name if status else "?",
            len(workflow_ids),
        )
    return cancelled


async def sweep_forever(client: Client, every_s: float) -> None:
    """`sweep_once` every `every_s` seconds until cancelled; a failed round is logged and the next one tries
    again (the sweep never stops the orchestrator). What it cancelled is counted in Prometheus
    (`trajflow_run_sweep_cancelled_total`)."""
    meter = meter_of(client)
    while True:
        await asyncio.sleep(every_s)
        try:
            for run, n in (await sweep_once(client)).items():
                record(meter, RUN_SWEEP_CANCELLED, n, run=run)
        except Exception as e:  # the server restarting, visibility lagging: the next round tries again
            log.warning("run sweep failed (next round in %.0fs): %r", every_s, e)
