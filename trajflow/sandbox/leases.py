"""Sandbox leases: which trajectory holds a sandbox, when it last used it, and when the sweep may remove it.

Every env activity on a sandbox (reset, step, close) renews its lease: the `SandboxManager` records the owning
workflow run and the last use. An env worker's sweep (`workers/sandbox_sweep.py`) asks `lease_verdict` about each
of its own sandboxes, with the state of the owning run as Temporal reports it:

- in use right now (a step in flight), or idle for at most `lease_s`: kept;
- idle past the lease while its run waits for a model call (a pending `llm.generate`: queued on a busy decode pool,
  or generating a long answer): kept, and the sweep renews the lease, however long the wait;
- idle past `cap_s` (`IDLE_CAP_LEASES` leases) otherwise: removed whatever Temporal says. A trajectory that moved
  to a fresh sandbox after a failure leaves its old one idle for ever (the sweep renews only the sandbox the run's
  `progress` query names), and a trajectory whose sandbox is removed while it still runs only pays a restore (its
  next step fails as `SandboxLost` and the workflow replays the recorded actions into a fresh sandbox);
- idle past `lease_s` and its run no longer running (terminated, cancelled, reset into a new run, timed out,
  unknown to Temporal): removed; still running, or Temporal cannot be asked: kept until the cap;
- a warm-pool sandbox waiting for a trajectory: kept (the pool is bounded by its size);
- not leased and not waiting in the pool (e.g. a reset that never finished handing it out): removed past the cap.

Sandboxes of other owners (dead env workers, here or in another host's container on the same engine) are the
reaper's (`trajflow.sandbox.reaper`), which the sweep runs too.
Limits: pure decisions over what the caller measured; idle time is this process's monotonic clock, so leases do not
survive a restart of their worker (its successor reaps the sandboxes as a dead owner's instead).
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

IDLE_CAP_LEASES = 10
"""A sandbox idle this many leases is removed even if Temporal says its trajectory still runs."""


class RunState(enum.Enum):
    """The owning workflow run, as Temporal reports it."""

    RUNNING = "running"
    CLOSED = "closed"
    """Completed, failed, cancelled, terminated, timed out, continued as new, or not found."""
    UNKNOWN = "unknown"
    """Temporal could not be asked (unreachable, an error): the lease is not judged by it this round."""
    WAITING = "waiting"
    """Running, with a model call pending (`llm.generate`): the trajectory waits for decode and comes back to its
    sandbox, so the sweep keeps it and renews its lease."""


class Holder(enum.Enum):
    """Who holds a sandbox of this worker."""

    TRAJECTORY = "trajectory"
    POOL = "pool"
    """Waiting in the warm pool for a trajectory."""
    NONE = "none"
    """Started, but not (yet) leased to a trajectory nor waiting in the pool."""


class Verdict(enum.Enum):
    KEEP = "keep"
    EXPIRED = "expired"
    """Idle past the lease and its run is no longer running."""
    IDLE_CAP = "idle_cap"
    """Idle past the hard cap, whatever its run."""


@dataclass(frozen=True)
class Lease:
    """A sandbox's lease as the manager records it (`SandboxManager.leases`)."""

    sandbox_id: str
    workflow_id: str
    """The owning trajectory's workflow id; "" while no trajectory holds it."""
    run_id: str
    idle_s: float
    """Seconds since the last use ended (0 while in use)."""
    busy: bool
    """A request (reset, step) is in flight on it."""


def lease_verdict(lease: Lease, holder: Holder, run: RunState, lease_s: float, cap_s: float) -> Verdict:
    """Whether the sweep removes this sandbox (see the module docstring for the rules)."""
    if lease.busy or holder is Holder.POOL or lease.idle_s <= lease_s:
        return Verdict.KEEP
    if holder is Holder.TRAJECTORY and run is RunState.WAITING:
        return Verdict.KEEP
    if lease.idle_s > cap_s:
        return Verdict.IDLE_CAP
    if holder is Holder.TRAJECTORY and run is RunState.CLOSED:
        return Verdict.EXPIRED
    return Verdict.KEEP


def needs_run_state(lease: Lease, holder: Holder, lease_s: float) -> bool:
    """Whether the verdict depends on the owning run's state (so the sweep asks Temporal only about these): a
    trajectory's sandbox idle past the lease, past the cap too (a run waiting for decode keeps it)."""
    return holder is Holder.TRAJECTORY and not lease.busy and lease.idle_s > lease_s


def cap_for(lease_s: float) -> float:
    """The hard idle cap for a lease of `lease_s`."""
    return lease_s * IDLE_CAP_LEASES


@dataclass
class _Entry:
    workflow_id: str = ""
    run_id: str = ""
    last_used: float = 0.0
    busy: int = 0


class LeaseBook:
    """The leases of one manager's sandboxes; thread-safe. `clock`: seconds, monotonic (a test passes its own)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    def add(self, sandbox_id: str) -> None:
        """A sandbox was started: held by nobody, its idle time counted from now."""
        with self._lock:
            self._entries[sandbox_id] = _Entry(last_used=self._clock())

    def drop(self, sandbox_id: str) -> None:
        with self._lock:
            self._entries.pop(sandbox_id, None)

    def grant(self, sandbox_id: str, workflow_id: str, run_id: str) -> None:
        """Lease the sandbox to the workflow run (`workflow_id`, `run_id`) and renew it; unknown ids are ignored."""
        with self._lock:
            entry = self._entries.get(sandbox_id)
            if entry is not None:
                entry.workflow_id, entry.run_id, entry.last_used = workflow_id, run_id, self._clock()

    def release(self, sandbox_id: str) -> bool:
        """End the sandbox's lease (held by nobody, idle from now) unless a request is in flight on it; True when
        released, False when it is busy or unknown."""
        with self._lock:
            entry = self._entries.get(sandbox_id)
            if entry is None or entry.busy:
                return False
            entry.workflow_id, entry.run_id, entry.last_used = "", "", self._clock()
            return True

    def now(self) -> float:
        """The book's clock, for `renew`'s `seen_at`."""
        return self._clock()

    def renew(self, sandbox_id: str, workflow_id: str, seen_at: float | None = None) -> bool:
        """Renew the lease of a sandbox that `workflow_id` still holds: idle from `seen_at` (the book's clock: when
        its run was seen waiting; now if None), never moved back. False when another holds it, nobody does, or it is
        unknown. A renewal dated by when the state was seen, not by when a slow answer came back, cannot outlast a
        run that ended meanwhile by more than one lease."""
        with self._lock:
            entry = self._entries.get(sandbox_id)
            if entry is None or not workflow_id or entry.workflow_id != workflow_id:
                return False
            entry.last_used = max(entry.last_used, self._clock() if seen_at is None else seen_at)
            return True

    def holder(self, sandbox_id: str) -> str | None:
        """The workflow id that holds the sandbox ("" while nobody does); None when it is unknown."""
        with self._lock:
            entry = self._entries.get(sandbox_id)
            return None if entry is None else entry.workflow_id

    @contextmanager
    def in_use(self, sandbox_id: str) -> Iterator[None]:
        """Mark the sandbox busy for the block (never idle, never swept) and renew its lease when the block ends."""
        with self._lock:
            entry = self._entries.get(sandbox_id)
            if entry is not None:
                entry.busy += 1
        try:
            yield
        finally:
            with self._lock:
                if entry is not None:
                    entry.busy -= 1
                    entry.last_used = self._clock()

    def snapshot(self) -> list[Lease]:
        now = self._clock()
        with self._lock:
            return [
                Lease(sid, e.workflow_id, e.run_id, 0.0 if e.busy else max(now - e.last_used, 0.0), e.busy > 0)
                for sid, e in self._entries.items()
            ]

    def take_idle(self, sandbox_id: str, idle_over_s: float) -> bool:
        """Drop the sandbox's lease and return True when it is still idle (not busy) past `idle_over_s`: the sweep
        decided on a snapshot, and a use since then must win."""
        with self._lock:
            entry = self._entries.get(sandbox_id)
            if entry is None or entry.busy or self._clock() - entry.last_used <= idle_over_s:
                return False
            del self._entries[sandbox_id]
            return True
