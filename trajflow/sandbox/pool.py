"""A warm pool: started sandboxes waiting, per image and env hint, so `env.reset` does not pay a container start.

`WarmPool.take(env_hint, image)` hands out a waiting sandbox (checked alive first) or, when none waits, starts
one cold; either way it asks a background thread to start a replacement. Keys are (image, env hint) pairs: a shell
task has its own image layer, and the runner imports only what its hint needs (see `trajflow/envs/runner.py`).

Reuse: when its trajectory is done, `give_back` puts a sandbox back to wait for the next trajectory of the same key,
up to `reuse` trajectories per sandbox, if its env is `reusable`: one whose actions are text the env parses (a
game, a puzzle, a math or QA answer, a gymnasium env, a dataset row), never code or commands it runs, and which the
runner builds anew at every reset, so nothing of one trajectory reaches the next but the runner process itself
(its imports: a reuse skips the container's start and stop and GEM's import, which on a small host preempt the
trainer). Shell tasks, agent programs, `py:` user envs and GEM's code and `eval:` envs always get a fresh
container (`reuse = 1`: every env does). A sandbox that comes back busy, dead, used up, or to a full pool is closed.
The refill counts sandboxes out on a reusable env (and takes and returns under way) as coming back, and returns may
fill the pool past `size` by the most sandboxes this pool has had out at once for the key; `trim` (the sweep) closes
those extra ones once they have waited a lease.

Shrinking: a key nobody has asked for in `unused_s` (an eval's env, a task that left the run) is forgotten by
`forget_unused` (the sweep): its waiting sandboxes are closed and the refill stops topping it up, until a take asks
for it again. A key with a sandbox out or a take or start under way is kept. All keys together never hold more than
`max_waiting` sandboxes waiting or starting: past it the refill starts none and a sandbox given back is closed.

Errors: `take` raises what `SandboxManager.start` raises (a cold start); a refill failure is logged and retried
after a back-off, never raised to a caller. Thread-safety: `take` and `give_back` may be called from many threads.
Limits: one refill thread (containers start one at a time, which suits a small host); waiting sandboxes count
against the host's memory like running ones (`max_waiting` bounds them); `size = 0` disables the pool (every take
is a cold start, and nothing is given back).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import docker.errors

from trajflow.sandbox.errors import SandboxError, SandboxLost
from trajflow.sandbox.manager import Sandbox, SandboxManager

log = logging.getLogger("trajflow.sandbox.pool")

Key = tuple[str, str]
"""(image, env hint)."""

REUSABLE_PREFIXES = ("game:", "rg:", "math:", "logic:", "qa:", "gym:", "data:")
"""Env ids whose sandbox may serve another trajectory (see the module docstring): not `shell:`, `agent:`,
`agent-cmd:`, `py:`, `code:` (runs the model's code) or `eval:` (some run code)."""

UNUSED_S = 600.0
"""A key not asked for in this long is forgotten (`WarmPool.forget_unused`)."""
MAX_WAITING = 32
"""The most sandboxes all keys of one pool keep waiting or starting together."""

REFILL_BACKOFF_S = (0.5, 30.0)
"""First and longest wait between refill attempts after a start failure (doubling in between)."""


@dataclass
class PoolStats:
    """What the pool has done since it started."""

    warm_hits: int = 0
    cold_starts: int = 0
    discarded_dead: int = 0
    refill_failures: int = 0
    given_back: int = 0
    """Sandboxes that came back from a trajectory to wait for the next one."""
    closed_on_return: int = 0
    forgotten: int = 0
    """Waiting sandboxes closed because their key went unused (`forget_unused`)."""


def reusable(env_id: str) -> bool:
    """Whether a sandbox that hosted `env_id` may host another trajectory of it (`REUSABLE_PREFIXES`)."""
    return env_id.startswith(REUSABLE_PREFIXES)


class WarmPool:
    """Keeps `size` started sandboxes waiting for each (image, env hint) it has been asked for (or pre-warmed) in the
    last `unused_s`, at most `max_waiting` in all; `reuse`: how many trajectories one sandbox of a `reusable` env may
    serve (1: a fresh container each). `clock`: seconds, monotonic (a test passes its own)."""

    def __init__(
        self,
        manager: SandboxManager,
        size: int,
        warm: tuple[Key, ...] = (),
        reuse: int = 1,
        unused_s: float = UNUSED_S,
        max_waiting: int = MAX_WAITING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if size < 0:
            raise ValueError(f"warm pool size must be >= 0, got {size}")
        if reuse < 1:
            raise ValueError(f"sandbox reuse must be >= 1 trajectory, got {reuse}")
        if unused_s <= 0 or max_waiting < 0:
            raise ValueError(f"need unused_s > 0 and max_waiting >= 0, got {unused_s} and {max_waiting}")
        self.manager = manager
        self.size = size
        self.reuse = reuse
        self.unused_s = unused_s
        self.max_waiting = max_waiting
        self._clock = clock
        self._asked: dict[Key, float] = {}
        """When each key was last asked for (a take, `wait_full`, pre-warming)."""
        self.stats = PoolStats()
        self._idle: dict[Key, collections.deque[Sandbox]] = {}
        self._starting: dict[Key, int] = {}
        self._out: dict[str, Key] = {}
        """Sandboxes handed out that may come back (a reusable env, not used up), by id."""
        self._returning: dict[str, Key] = {}
        """Sandboxes being given back (out of `_out`, not yet waiting or closed): still coming back for the refill."""
        self._peak: dict[Key, int] = {}
        """The most sandboxes out at once per key: how far returns may fill the pool past `size`."""
        self._waiting_since: dict[str, float] = {}
        self._taking: collections.Counter[Key] = collections.Counter()
        """Takes under way per key (a waiting sandbox being checked, or a cold start): counted from the moment the
        take finds the pool's queue to the moment `_handed_out` knows whether the sandbox will come back, under the
        lock throughout, so the refill never sees a taken sandbox as neither waiting nor out."""
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        for key in warm:
            self._want(key)

    def take(self, env_hint: str = "", image: str | None = None) -> Sandbox:
        """A started sandbox from `image` (default: the manager's) for `env_hint`, ready for `reset`; it is the
        caller's to close."""
        return self.take_noting_hit(env_hint, image)[0]

    def take_noting_hit(self, env_hint: str = "", image: str | None = None) -> tuple[Sandbox, bool]:
        """`take`, and whether the sandbox was waiting warm (True) or had to be started (False)."""
        key = (image or self.manager.image, env_hint)
        with self._cond:
            self._want(key)
            self._taking[key] += 1
        try:
            box, hit = self._waiting_or_started(key)
        except BaseException:
            self._untake(key)
            raise
        return self._handed_out(key, box), hit

    def _waiting_or_started(self, key: Key) -> tuple[Sandbox, bool]:
        """A live waiting sandbox of `key` (True), or one started cold (False), for a take counted in `_taking`."""
        while True:
            with self._cond:
                idle = self._idle[key]
                box = idle.popleft() if idle else None
                if box is not None:
                    self._waiting_since.pop(box.id, None)
                self._cond.notify_all()  # a slot freed: the refill thread tops this hint up
            if box is None:
                break
            try:
                self.manager.get(box.id)  # raises SandboxLost if it died while it waited
            except SandboxLost as e:
                log.warning("discarding a dead warm sandbox: %s", e)
                self.stats.discarded_dead += 1
                self.manager.close(box.id)
                continue
            self.stats.warm_hits += 1
            return box, True
        self.stats.cold_starts += 1
        return self.manager.start(key[1], key[0]), False

    def give_back(self, sandbox_id: str) -> bool:
        """Its trajectory is done with the sandbox: keep it waiting for the next one (True) or close it (False; see
        the module docstring for when). Giving back a sandbox twice, or one this pool did not hand out, closes it
        unless it is already waiting here or the first give-back is still under way (True: that one decides). Until
        it decides, the sandbox counts as coming back, so the refill starts no replacement that its return would make
        surplus."""
        with self._cond:
            if sandbox_id in self._waiting_since or sandbox_id in self._returning:
                return True  # a repeated give-back
            key = self._out.pop(sandbox_id, None)
            if key is not None:
                self._returning[sandbox_id] = key
        box = None
        try:
            if key is not None and self.manager.leases.release(sandbox_id):  # False: a request is still in flight
                try:
                    box = self.manager.get(sandbox_id)
                except SandboxLost:
                    box = None
        finally:
            with self._cond:
                self._returning.pop(sandbox_id, None)
                kept = box is not None and key is not None and self._keep(key, box)
                self._cond.notify_all()  # waiting now, or never coming back: the refill counts it anew
        if kept:
            return True
        self.stats.closed_on_return += 1
        self.manager.close(sandbox_id)
        return False

    def _keep(self, key: Key, box: Sandbox) -> bool:
        """Put a returned `box` to wait for the next take of `key` if the pool has room for it (under the lock)."""
        if self._closed or len(self._idle[key]) >= self.size + self._peak.get(key, 0):
            return False
        if self._waiting_total() >= self.max_waiting:
            return False
        self._idle[key].append(box)
        self._waiting_since[box.id] = self._clock()
        self.stats.given_back += 1
        return True

    def trim(self, idle_over_s: float) -> int:
        """Close the sandboxes that wait past `size` for a key and have waited over `idle_over_s` (returns after a
        burst), and let that key's peak fall back; how many were closed."""
        now = self._clock()
        extra: list[Sandbox] = []
        with self._cond:
            for key, idle in self._idle.items():
                while len(idle) > self.size and now - self._waiting_since.get(idle[0].id, now) > idle_over_s:
                    box = idle.popleft()
                    self._waiting_since.pop(box.id, None)
                    extra.append(box)
                self._peak[key] = max(self._out_count(key), len(idle))
            self._cond.notify_all()  # room under `max_waiting` for other keys
        for box in extra:
            self.manager.close(box.id)
        return len(extra)

    def forget_unused(self) -> int:
        """Forget the keys nobody asked for in `unused_s` and that have nothing out, taken or starting: close their
        waiting sandboxes, and the refill tops them up no more (a later take asks for the key anew); how many
        sandboxes were closed."""
        now = self._clock()
        closed: list[Sandbox] = []
        with self._cond:
            busy = {*self._out.values(), *self._returning.values()}
            for key in [k for k, at in self._asked.items() if now - at > self.unused_s]:
                if key in busy or self._taking[key] or self._starting.get(key, 0):
                    continue
                for box in self._idle.pop(key, ()):
                    self._waiting_since.pop(box.id, None)
                    closed.append(box)
                for table in (self._starting, self._peak, self._asked, self._taking):
                    table.pop(key, None)
            self._cond.notify_all()  # room under `max_waiting` for the keys still asked for
        for box in closed:
            self.manager.close(box.id)
        self.stats.forgotten += len(closed)
        return len(closed)

    def _waiting_total(self) -> int:
        """Sandboxes waiting or starting, all keys together (under the lock)."""
        return sum(len(q) for q in self._idle.values()) + sum(self._starting.values())

    def _handed_out(self, key: Key, box: Sandbox) -> Sandbox:
        """End the take of `box`: out and coming back (a reusable env, not used up), or gone for the refill."""
        box.served += 1
        with self._cond:
            self._taking[key] -= 1
            if self.size > 0 and box.served < self.reuse and reusable(key[1]):
                self._out[box.id] = key
                self._peak[key] = max(self._peak.get(key, 0), self._out_count(key))
            self._cond.notify_all()  # the refill counted the take as coming back: it may now be short
        return box

    def _untake(self, key: Key) -> None:
        """A take of `key` ended without a sandbox (its cold start, or the check of a waiting one, raised)."""
        with self._cond:
            self._taking[key] -= 1
            self._cond.notify_all()

    def _out_count(self, key: Key) -> int:
        """Sandboxes of `key` out that may come back (under the lock)."""
        return sum(1 for k in self._out.values() if k == key)

    def idle_count(self, env_hint: str = "", image: str | None = None) -> int:
        with self._cond:
            return len(self._idle.get((image or self.manager.image, env_hint), ()))

    def waiting_ids(self) -> set[str]:
        """The ids of the sandboxes waiting here (leased to no trajectory: the sweep leaves them alone)."""
        with self._cond:
            return {box.id for idle in self._idle.values() for box in idle}

    def wait_full(self, env_hint: str = "", image: str | None = None, timeout_s: float = 60) -> bool:
        """Block until `size` sandboxes wait for (`image`, `env_hint`) (True) or the timeout passes (False)."""
        key = (image or self.manager.image, env_hint)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._want(key)
            while len(self._idle.get(key, ())) < self.size:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    return False
                self._cond.wait(remaining)
            return True

    def close(self) -> None:
        """Stop refilling and remove every waiting sandbox (sandboxes already handed out are not touched)."""
        with self._cond:
            self._closed = True
            waiting = [box for idle in self._idle.values() for box in idle]
            self._idle.clear()
            self._waiting_since.clear()
            self._out.clear()
            self._cond.notify_all()
        for box in waiting:
            self.manager.close(box.id)
        if self._thread is not None:
            self._thread.join(timeout=self.manager.start_timeout_s + 5)

    def _want(self, key: Key) -> None:
        """Register `key` as asked for now (under the condition's lock) and make sure the refill thread runs."""
        if key not in self._idle:
            self._idle[key] = collections.deque()
            self._starting[key] = 0
            self._cond.notify_all()  # a new key to fill: wake the refill thread if it waits
        self._asked[key] = self._clock()
        if self.size > 0 and self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._refill_loop, name="warm-pool-refill", daemon=True)
            self._thread.start()

    def _next_key(self) -> Key | None:
        """The key with the largest shortfall, or None when every key is full (under the lock). Sandboxes out that
        will come back count as supply; one that was closed elsewhere (a failed reset, the sweep) no longer does."""
        live = set(self.manager.sandbox_ids())
        for gone in [sid for sid in self._out if sid not in live]:
            del self._out[gone]
        back = collections.Counter(self._out.values())
        back.update(self._returning.values())
        if self.reuse > 1:
            back.update({k: n for k, n in self._taking.items() if reusable(k[1])})
        if self._waiting_total() >= self.max_waiting:
            return None
        short = {k: self.size - len(q) - self._starting[k] - back[k] for k, q in self._idle.items()}
        key = max(short, key=lambda k: short[k], default=None)
        return key if key is not None and short[key] > 0 else None

    def _refill_loop(self) -> None:
        backoff = REFILL_BACKOFF_S[0]
        while True:
            with self._cond:
                key = self._next_key()
                while key is None and not self._closed:
                    self._cond.wait()
                    key = self._next_key()
                if self._closed:
                    return
                assert key is not None
                self._starting[key] += 1
            image, hint = key
            try:
                box = self.manager.start(hint, image)
            except (SandboxError, docker.errors.DockerException, OSError) as e:
                self.stats.refill_failures += 1
                log.warning("warm pool: starting %s for %r failed (retry in %.1fs): %s", image, hint, backoff, e)
                with self._cond:
                    self._starting[key] -= 1
                    self._cond.wait(backoff)
                backoff = min(backoff * 2, REFILL_BACKOFF_S[1])
                continue
            backoff = REFILL_BACKOFF_S[0]
            with self._cond:
                self._starting[key] -= 1
                closed = self._closed
                if not closed:
                    self._idle[key].append(box)
                    self._cond.notify_all()
            if closed:
                self.manager.close(box.id)
                return
