"""The sweep's decisions over hand-made leases, the lease book's bookkeeping, which envs' sandboxes are reused, and
finding one's own container."""

from __future__ import annotations

import pytest

from tests.conftest import ManualClock
from trajflow.sandbox import labels
from trajflow.sandbox.leases import (
    IDLE_CAP_LEASES,
    Holder,
    Lease,
    LeaseBook,
    RunState,
    Verdict,
    cap_for,
    lease_verdict,
    needs_run_state,
)
from trajflow.sandbox.pool import reusable

LEASE_S = 60.0
CAP_S = cap_for(LEASE_S)


def lease(idle_s: float, busy: bool = False, workflow_id: str = "traj-1") -> Lease:
    return Lease("abc123", workflow_id, "run-1" if workflow_id else "", idle_s, busy)


@pytest.mark.parametrize(
    ("case", "holder", "run", "verdict"),
    [
        # a trajectory between steps (decode) keeps its sandbox whatever Temporal says
        (lease(30), Holder.TRAJECTORY, RunState.CLOSED, Verdict.KEEP),
        # idle past the lease: removed when the run is over (terminated, reset, not found), kept while it runs
        (lease(61), Holder.TRAJECTORY, RunState.CLOSED, Verdict.EXPIRED),
        (lease(61), Holder.TRAJECTORY, RunState.RUNNING, Verdict.KEEP),
        (lease(61), Holder.TRAJECTORY, RunState.UNKNOWN, Verdict.KEEP),
        # idle past the cap: removed even though the run goes on (it moved to a fresh sandbox, or restores by replay)
        (lease(CAP_S + 1), Holder.TRAJECTORY, RunState.RUNNING, Verdict.IDLE_CAP),
        (lease(CAP_S + 1), Holder.TRAJECTORY, RunState.UNKNOWN, Verdict.IDLE_CAP),
        # ... but never while its run waits for decode with this sandbox as its own, however long
        (lease(61), Holder.TRAJECTORY, RunState.WAITING, Verdict.KEEP),
        (lease(CAP_S * 5), Holder.TRAJECTORY, RunState.WAITING, Verdict.KEEP),
        # a step in flight is never judged, however long it runs
        (lease(0, busy=True), Holder.TRAJECTORY, RunState.CLOSED, Verdict.KEEP),
        (Lease("abc123", "traj-1", "run-1", CAP_S * 2, True), Holder.TRAJECTORY, RunState.CLOSED, Verdict.KEEP),
        # a warm sandbox waiting in the pool is leased to nobody and never swept
        (lease(CAP_S * 5, workflow_id=""), Holder.POOL, RunState.UNKNOWN, Verdict.KEEP),
        # held by nobody and not waiting (a reset that never handed it out): only the cap removes it
        (lease(61, workflow_id=""), Holder.NONE, RunState.UNKNOWN, Verdict.KEEP),
        (lease(CAP_S + 1, workflow_id=""), Holder.NONE, RunState.UNKNOWN, Verdict.IDLE_CAP),
    ],
)
def test_lease_verdicts(case: Lease, holder: Holder, run: RunState, verdict: Verdict) -> None:
    assert lease_verdict(case, holder, run, LEASE_S, CAP_S) is verdict


def test_temporal_is_asked_only_when_its_answer_decides() -> None:
    assert needs_run_state(lease(61), Holder.TRAJECTORY, LEASE_S)
    assert not needs_run_state(lease(59), Holder.TRAJECTORY, LEASE_S)  # fresh: kept anyway
    assert needs_run_state(
        lease(CAP_S + 1), Holder.TRAJECTORY, LEASE_S
    )  # past the cap: kept only if it waits for decode
    assert not needs_run_state(lease(61, busy=True), Holder.TRAJECTORY, LEASE_S)
    assert not needs_run_state(lease(61, workflow_id=""), Holder.NONE, LEASE_S)
    assert cap_for(LEASE_S) == LEASE_S * IDLE_CAP_LEASES


def test_the_book_renews_on_every_use_and_counts_a_busy_sandbox_as_never_idle() -> None:
    clock = ManualClock()
    book = LeaseBook(clock)
    book.add("s1")
    clock.now += 10
    (only,) = book.snapshot()
    assert (only.workflow_id, only.idle_s, only.busy) == ("", 10, False)
    book.grant("s1", "traj-1", "run-1")
    (only,) = book.snapshot()
    assert (only.workflow_id, only.run_id, only.idle_s) == ("traj-1", "run-1", 0)
    with book.in_use("s1"):
        clock.now += 500  # a long step
        (only,) = book.snapshot()
        assert only.busy and only.idle_s == 0
        assert not book.take_idle("s1", 60)  # in use: never taken
    clock.now += 5
    (only,) = book.snapshot()
    assert not only.busy and only.idle_s == 5  # the lease counts from the end of the step
    book.grant("unknown", "traj-2", "run-2")  # a sandbox closed meanwhile: nothing to lease
    with book.in_use("unknown"):
        pass
    assert [x.sandbox_id for x in book.snapshot()] == ["s1"]


def test_take_idle_rechecks_against_a_use_since_the_snapshot() -> None:
    clock = ManualClock()
    book = LeaseBook(clock)
    book.add("s1")
    clock.now += 100
    assert book.snapshot()[0].idle_s == 100  # the sweep decides on this ...
    with book.in_use("s1"):  # ... and a step comes in before it removes
        pass
    assert not book.take_idle("s1", 60)
    clock.now += 61
    assert book.take_idle("s1", 60)
    assert book.snapshot() == []
    assert not book.take_idle("s1", 60)  # already taken (or closed): nothing to do twice


def test_a_release_ends_the_lease_unless_a_request_is_in_flight() -> None:
    clock = ManualClock()
    book = LeaseBook(clock)
    book.add("s1")
    book.grant("s1", "wf-a", "run-1")
    assert book.holder("s1") == "wf-a" and book.holder("nope") is None
    with book.in_use("s1"):
        assert not book.release("s1")  # busy: it must not go back to the pool
    assert book.holder("s1") == "wf-a"
    clock.now += 50
    assert book.release("s1") and book.holder("s1") == ""
    assert book.snapshot()[0].idle_s == 0  # idle from the release on, not from the last step
    assert not book.release("nope")


@pytest.mark.parametrize(
    ("env_id", "reused"),
    [
        ("game:GuessTheNumber-v0-easy", True),
        ("rg:basic_arithmetic", True),
        ("math:GSM8K", True),
        ("gym:FrozenLake-v1", True),
        ("data:questions", True),
        ("shell:slugify", False),
        ("agent:mod:run", False),
        ("agent-cmd:run.sh", False),
        ("py:mod:Env", False),
        ("code:CodeContest", False),
        ("eval:CodeContest", False),
    ],
)
def test_only_envs_whose_actions_are_parsed_never_run_are_reusable(env_id: str, reused: bool) -> None:
    assert reusable(env_id) is reused


MOUNTINFO = """\
1570 1398 0:173 / / rw,relatime master:598 - overlay overlay rw,lowerdir=/var/lib/docker/overlay2/l/X
1580 1570 254:1 /var/lib/docker/containers/{id}/resolv.conf /etc/resolv.conf rw,relatime - ext4 /dev/vda1 rw
1581 1570 254:1 /var/lib/docker/containers/{id}/hostname /etc/hostname rw,relatime - ext4 /dev/vda1 rw
1582 1570 254:1 /var/lib/docker/containers/{id}/hosts /etc/hosts rw,relatime - ext4 /dev/vda1 rw
"""


def test_own_container_id_is_read_from_the_mounted_docker_files() -> None:
    cid = "0123456789abcdef" * 4
    assert labels.container_ids_in_mountinfo(MOUNTINFO.format(id=cid)) == [cid]
    assert labels.container_ids_in_mountinfo("25 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n") == []


def test_labels_name_the_owner_container_only_when_there_is_one() -> None:
    assert labels.OWNER_CONTAINER not in labels.owner_labels("w", "s")
    placed = labels.owner_labels("w", "s", "host", labels.OwnerContainer("c" * 64, "2026-01-01T00:00:00Z"))
    assert placed[labels.OWNER_CONTAINER] == "c" * 64
    assert placed[labels.OWNER_CONTAINER_STARTED] == "2026-01-01T00:00:00Z"


def test_a_renewal_counts_only_for_the_sandboxs_holder() -> None:
    clock = ManualClock()
    book = LeaseBook(clock)
    book.add("s1")
    book.grant("s1", "wf-a", "run-1")
    clock.now += 300
    assert not book.renew("s1", "wf-b") and not book.renew("s1", "") and not book.renew("gone", "wf-a")
    assert book.snapshot()[0].idle_s == 300
    assert book.renew("s1", "wf-a")  # its trajectory waits for decode: idle from now
    assert book.snapshot()[0].idle_s == 0
    book.release("s1")
    clock.now += 10
    assert not book.renew("s1", "wf-a")  # released: nobody holds it


def test_a_renewal_never_moves_the_last_use_back() -> None:
    clock = ManualClock()
    book = LeaseBook(clock)
    book.add("s1")
    book.grant("s1", "wf-a", "run-1")
    clock.now += 100
    assert book.renew("s1", "wf-a", seen_at=clock.now - 40)
    assert book.snapshot()[0].idle_s == 40
    assert book.renew("s1", "wf-a", seen_at=clock.now - 70)  # seen before the last renewal: changes nothing
    assert book.snapshot()[0].idle_s == 40
