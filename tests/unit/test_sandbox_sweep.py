"""The env worker's sweep over a lease book, with Temporal's answers stood in for: a slow answer renews a waiting
run's lease only as of when the round asked (so a run that ended meanwhile loses its sandbox a lease later, not a
lease after the answer), and a progress query that does not answer within a quarter of the lease counts as waiting
instead of holding the round back. The real sweep against the dev server and Docker: tests/integration/
test_sandbox_leases.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest
from temporalio.client import WorkflowExecutionStatus

from tests.conftest import ManualClock
from trajflow.contracts import names
from trajflow.contracts.trajectory import TrajectoryProgress
from trajflow.sandbox.leases import LeaseBook, RunState
from trajflow.workers import sandbox_sweep
from trajflow.workers.sandbox_sweep import Sweeper

LEASE_S = 60.0


def waiting_run() -> SimpleNamespace:
    """What `describe` returns for a running trajectory with a model call pending."""
    generate = SimpleNamespace(activity_type=SimpleNamespace(name=names.LLM_GENERATE))
    return SimpleNamespace(
        status=WorkflowExecutionStatus.RUNNING, raw_description=SimpleNamespace(pending_activities=[generate])
    )


def progress(sandbox: str) -> TrajectoryProgress:
    return TrajectoryProgress(
        env_id="game:GuessTheNumber-v0",
        max_turns=6,
        turn=1,
        sandbox=sandbox,
        host_queue=None,
        env_recoveries=0,
        last_observation="",
    )


def stand_ins(book: LeaseBook, query) -> tuple[Any, Any, list[str]]:
    closed: list[str] = []

    def expire(sandbox_id: str, idle_over_s: float) -> bool:
        if not book.take_idle(sandbox_id, idle_over_s):
            return False
        closed.append(sandbox_id)
        return True

    manager = SimpleNamespace(leases=book, client=None, runtime_dir=None, host_name="here", expire=expire)
    handle = SimpleNamespace(query=query)
    client = SimpleNamespace(
        service_client=SimpleNamespace(config=SimpleNamespace(runtime=None)),
        get_workflow_handle=lambda workflow_id, run_id=None: handle,
    )
    return manager, client, closed


@pytest.fixture(autouse=True)
def no_reaper(monkeypatch) -> None:
    monkeypatch.setattr(sandbox_sweep, "reap_orphans", lambda *args: [])


def test_a_slow_answer_renews_as_of_the_asking_so_a_run_ended_meanwhile_loses_its_sandbox_a_lease_later(
    monkeypatch,
) -> None:
    clock = ManualClock()
    book = LeaseBook(clock)
    book.add("s1")
    book.grant("s1", "wf-a", "run-1")
    clock.now += LEASE_S + 40  # idle past the lease: the sweep asks about its run
    asked_at = clock.now
    runs: dict[str, SimpleNamespace | None] = {"state": waiting_run()}

    async def describe(client, workflow_id, run_id):
        return runs["state"]

    async def query(name, result_type):
        assert name == names.QUERY_PROGRESS
        clock.now += 30  # the answer comes back 30 s later: a busy workflow worker
        runs["state"] = None  # and the run is terminated meanwhile (Temporal no longer lists it as running)
        return progress("s1")

    monkeypatch.setattr(sandbox_sweep, "describe", describe)
    manager, client, closed = stand_ins(book, query)
    sweeper = Sweeper(cast("Any", manager), cast("Any", client), LEASE_S)
    asyncio.run(sweeper.sweep())
    assert sweeper.stats.renewed == 1 and not closed
    (lease,) = book.snapshot()
    assert lease.idle_s == clock.now - asked_at == 30  # renewed as of the asking, not of the answer

    clock.now = asked_at + LEASE_S + 1  # a lease after the asking: 31 s after the answer
    asyncio.run(sweeper.sweep())
    assert closed == ["s1"] and sweeper.stats.expired == 1


def test_a_progress_query_unanswered_within_a_quarter_lease_counts_as_waiting(monkeypatch) -> None:
    book = LeaseBook()

    async def describe(client, workflow_id, run_id):
        return waiting_run()

    async def query(name, result_type):
        await asyncio.Event().wait()  # no answer at all

    monkeypatch.setattr(sandbox_sweep, "describe", describe)
    manager, client, _ = stand_ins(book, query)
    sweeper = Sweeper(cast("Any", manager), cast("Any", client), lease_s=0.4)
    assert sweeper.query_timeout_s == pytest.approx(0.1)

    async def ask() -> RunState:
        return await asyncio.wait_for(sweeper.run_state("wf-a", "run-1", "s1"), timeout=5)

    assert asyncio.run(ask()) is RunState.WAITING


def test_a_failed_progress_query_counts_as_running_and_a_slow_describe_as_unknown(monkeypatch) -> None:
    book = LeaseBook()
    slow = {"describe": False}

    async def describe(client, workflow_id, run_id):
        if slow["describe"]:
            await asyncio.Event().wait()
        return waiting_run()

    async def query(name, result_type):
        raise RuntimeError("the query failed")

    monkeypatch.setattr(sandbox_sweep, "describe", describe)
    manager, client, _ = stand_ins(book, query)
    sweeper = Sweeper(cast("Any", manager), cast("Any", client), lease_s=0.4)
    assert asyncio.run(sweeper.run_state("wf-a", "run-1", "s1")) is RunState.RUNNING
    slow["describe"] = True
    assert asyncio.run(asyncio.wait_for(sweeper.run_state("wf-a", "run-1", "s1"), 5)) is RunState.UNKNOWN
