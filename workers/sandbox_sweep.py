"""The env worker's sandbox sweep: removes sandboxes whose lease ran out, and orphans of dead env workers.

Every `interval` (a quarter of the lease) it (1) asks Temporal about the owning run of each of its own sandboxes
idle past the lease (described by workflow id and run id: a reset workflow leaves the old run terminated; a run
Temporal does not know counts as closed), (2) removes what `trajflow.sandbox.leases.lease_verdict` says, and
(3) runs the reaper (`trajflow.sandbox.reaper.reap_orphans`) for the sandboxes of dead owners on this engine (this
host's earlier runs, another host's dead worker); it also (4) closes the sandboxes that came back to the warm pool
past its size and waited a lease (`WarmPool.trim`). The first round runs before the worker starts sandboxes.

Timing: a round asks about all its sandboxes at once and has every answer within `query_timeout_s` (a quarter of
a lease, at most `DESCRIBE_TIMEOUT_S`); a renewal is dated from the round's start, when the runs were seen, not
from the answer. So a slow answer (a busy workflow worker) neither holds the next round back by more than that nor
extends the lease of a run that ended meanwhile: its sandbox goes within 1.5 leases of the run's end (the lease, an
interval, a round's answers), plus the time Docker takes to remove it.

Errors: a round that fails (Docker or Temporal unreachable, anything else) is logged and the next round tries
again; the sweep never stops the worker. Limits: one engine (this host's); a sandbox used by no activity for
`IDLE_CAP_LEASES` leases is removed even while its trajectory runs (it restores by replay).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import MetricMeter
from temporalio.service import RPCError

from trajflow.contracts import names
from trajflow.contracts.metrics import SANDBOXES_SWEPT
from trajflow.contracts.trajectory import TrajectoryProgress
from trajflow.infra.temporal import describe
from trajflow.observability.metrics import meter_of, record
from trajflow.sandbox.leases import Holder, Lease, RunState, Verdict, cap_for, lease_verdict, needs_run_state
from trajflow.sandbox.manager import SandboxManager
from trajflow.sandbox.pool import WarmPool
from trajflow.sandbox.reaper import reap_orphans

log = logging.getLogger("trajflow.sweep")
DESCRIBE_TIMEOUT_S = 10.0
"""The longest the sweep waits for Temporal's answers about one run (less where a quarter of the lease is less)."""
MIN_INTERVAL_S = 0.5


@dataclass
class SweepStats:
    """What the sweep has removed since the worker started."""

    expired: int = 0
    idle_cap: int = 0
    renewed: int = 0
    """Leases renewed because their trajectory waited for decode."""
    orphans: int = 0
    failed_rounds: int = 0


class Sweeper:
    """Sweeps one env worker's sandboxes (see the module docstring)."""

    def __init__(
        self,
        manager: SandboxManager,
        client: Client | None,
        lease_s: float,
        warm: WarmPool | None = None,
    ) -> None:
        if lease_s <= 0:
            raise ValueError(f"the sandbox lease must be > 0 seconds, got {lease_s}")
        self.manager = manager
        self.client = client
        self.lease_s = lease_s
        self.cap_s = cap_for(lease_s)
        self.warm = warm
        self.interval_s = max(lease_s / 4, MIN_INTERVAL_S)
        self.query_timeout_s = min(DESCRIBE_TIMEOUT_S, lease_s / 4)
        self.stats = SweepStats()
        self.meter = meter_of(client) if client is not None else MetricMeter.noop
        """Where removals are counted (`trajflow_sandboxes_swept_total`, by reason)."""

    async def run_forever(self) -> None:
        """Sweep every `interval_s` until cancelled; a failed round is logged, never raised."""
        while True:
            await self.sweep_logged()
            await asyncio.sleep(self.interval_s)

    async def sweep_logged(self) -> None:
        try:
            await self.sweep()
        except asyncio.CancelledError:
            raise
        except Exception:  # whatever fails, the worker keeps serving and the next round retries
            self.stats.failed_rounds += 1
            log.warning("sandbox sweep failed; trying again in %.1fs", self.interval_s, exc_info=True)

    async def sweep(self) -> None:
        """One round: own sandboxes by lease, then others' orphans."""
        waiting = self.warm.waiting_ids() if self.warm is not None else set()
        leases = self.manager.leases.snapshot()
        holders = {lease.sandbox_id: _holder(lease, waiting) for lease in leases}
        asked = [x for x in leases if needs_run_state(x, holders[x.sandbox_id], self.lease_s)]
        seen_at = self.manager.leases.now()  # every answer below describes its run at this time or later
        states = await asyncio.gather(*(self.run_state(x.workflow_id, x.run_id, x.sandbox_id) for x in asked))
        runs = {x.sandbox_id: state for x, state in zip(asked, states, strict=True)}
        for lease in leases:
            run = runs.get(lease.sandbox_id, RunState.UNKNOWN)
            if run is RunState.WAITING and self.manager.leases.renew(lease.sandbox_id, lease.workflow_id, seen_at):
                self.stats.renewed += 1
                continue
            verdict = lease_verdict(lease, holders[lease.sandbox_id], run, self.lease_s, self.cap_s)
            if verdict is not Verdict.KEEP:
                await self._remove(lease, verdict)
        if self.warm is not None:
            trimmed = await asyncio.to_thread(self.warm.trim, self.lease_s)
            if trimmed:
                record(self.meter, SANDBOXES_SWEPT, trimmed, reason="pool_surplus")
                log.info("closed %d sandboxes waiting past the warm pool's size for a lease", trimmed)
            forgotten = await asyncio.to_thread(self.warm.forget_unused)
            if forgotten:
                record(self.meter, SANDBOXES_SWEPT, forgotten, reason="pool_unused")
                log.info("closed %d waiting sandboxes of envs unused for %.0fs", forgotten, self.warm.unused_s)
        reaped = await asyncio.to_thread(
            reap_orphans, self.manager.client, self.manager.runtime_dir, self.manager.host_name
        )
        if reaped:
            self.stats.orphans += len(reaped)
            record(self.meter, SANDBOXES_SWEPT, len(reaped), reason="orphan")
            log.info("reaped %d orphaned sandboxes of dead env workers", len(reaped))

    async def _remove(self, lease: Lease, verdict: Verdict) -> None:
        idle_over = self.lease_s if verdict is Verdict.EXPIRED else self.cap_s
        if not await asyncio.to_thread(self.manager.expire, lease.sandbox_id, idle_over):
            return  # used again since the snapshot: its lease was renewed
        if verdict is Verdict.EXPIRED:
            self.stats.expired += 1
        else:
            self.stats.idle_cap += 1
        record(self.meter, SANDBOXES_SWEPT, 1, reason=verdict.value)
        owner = f"workflow {lease.workflow_id} run {lease.run_id}" if lease.workflow_id else "no trajectory"
        log.info("removed sandbox %s (%s, idle %.0fs, %s)", lease.sandbox_id, owner, lease.idle_s, verdict.value)

    async def run_state(self, workflow_id: str, run_id: str, sandbox_id: str = "") -> RunState:
        """The owning run's state; UNKNOWN without a client or when Temporal cannot answer. WAITING: running with a
        model call pending, and (its `progress` query says) `sandbox_id` is the sandbox it will step next, not one it
        left after a failure, or the query did not answer in time (a workflow worker too busy to answer is no sign of
        an abandoned sandbox: kept, and removed once the run ends)."""
        if self.client is None:
            return RunState.UNKNOWN
        deadline = asyncio.get_running_loop().time() + self.query_timeout_s  # for both calls together
        try:
            async with asyncio.timeout_at(deadline):
                described = await describe(self.client, workflow_id, run_id or None)
        except RPCError as e:
            log.warning("cannot describe workflow %s run %s: %s", workflow_id, run_id, e)
            return RunState.UNKNOWN
        except TimeoutError:
            log.warning("describing workflow %s run %s took over %.1fs", workflow_id, run_id, self.query_timeout_s)
            return RunState.UNKNOWN
        if described is None or described.status != WorkflowExecutionStatus.RUNNING:  # None: Temporal knows no such run
            return RunState.CLOSED
        pending = {a.activity_type.name for a in described.raw_description.pending_activities}
        if names.LLM_GENERATE not in pending or not sandbox_id:
            return RunState.RUNNING
        handle = self.client.get_workflow_handle(workflow_id, run_id=run_id or None)
        try:
            async with asyncio.timeout_at(deadline):
                progress = await handle.query(names.QUERY_PROGRESS, result_type=TrajectoryProgress)
        except TimeoutError:  # a busy (or absent) workflow worker: the model call is pending, so it waits
            log.info("workflow %s run %s did not answer its progress query in time", workflow_id, run_id)
            return RunState.WAITING
        except Exception as e:  # the query failed (not a timeout): judged as running (the cap applies)
            log.warning("cannot query workflow %s run %s: %r", workflow_id, run_id, e)
            return RunState.RUNNING
        return RunState.WAITING if progress.sandbox == sandbox_id else RunState.RUNNING


def _holder(lease: Lease, waiting: set[str]) -> Holder:
    if lease.workflow_id:
        return Holder.TRAJECTORY
    return Holder.POOL if lease.sandbox_id in waiting else Holder.NONE
