"""A warm pool: started sandboxes waiting, per image and env hint, so `env.reset` does not pay a container start.

`WarmPool.take(env_hint, image)` hands out a waiting sandbox (checked alive first) or, when none waits, starts
one cold; either way it asks a background thread to start a replacement. A sandbox is handed out once and never
returns to the pool: every trajectory gets a fresh container. Keys are (image, env hint) pairs: a shell task has
its own image layer, and the runner imports only what its hint needs (see `trajflow/envs/runner.py`).

Errors: `take` raises what `SandboxManager.start` raises (a cold start); a refill failure is logged and retried
after a back-off, never raised to a caller. Thread-safety: `take` may be called from many threads.
Limits: one refill thread (containers start one at a time, which suits a small host); waiting sandboxes count
against the host's memory like running ones; `size = 0` disables the pool (every take is a cold start).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass

import docker.errors

from trajflow.sandbox.errors import SandboxError, SandboxLost
from trajflow.sandbox.manager import Sandbox, SandboxManager

log = logging.getLogger("trajflow.sandbox.pool")

Key = tuple[str, str]
"""(image, env hint)."""

REFILL_BACKOFF_S = (0.5, 30.0)
"""First and longest wait between refill attempts after a start failure (doubling in between)."""


@dataclass
class PoolStats:
    """What the pool has done since it started."""

    warm_hits: int = 0
    cold_starts: int = 0
    discarded_dead: int = 0
    refill_failures: int = 0


class WarmPool:
    """Keeps `size` started sandboxes waiting for each (image, env hint) it has been asked for (or pre-warmed)."""

    def __init__(self, manager: SandboxManager, size: int, warm: tuple[Key, ...] = ()) -> None:
        if size < 0:
            raise ValueError(f"warm pool size must be >= 0, got {size}")
        self.manager = manager
        self.size = size
        self.stats = PoolStats()
        self._idle: dict[Key, collections.deque[Sandbox]] = {}
        self._starting: dict[Key, int] = {}
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
        while True:
            with self._cond:
                self._want(key)
                idle = self._idle.get(key)
                box = idle.popleft() if idle else None
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
        return self.manager.start(env_hint, key[0]), False

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
            while len(self._idle[key]) < self.size:
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
            self._cond.notify_all()
        for box in waiting:
            self.manager.close(box.id)
        if self._thread is not None:
            self._thread.join(timeout=self.manager.start_timeout_s + 5)

    def _want(self, key: Key) -> None:
        """Register `key` (under the condition's lock) and make sure the refill thread runs."""
        self._idle.setdefault(key, collections.deque())
        self._starting.setdefault(key, 0)
        if self.size > 0 and self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._refill_loop, name="warm-pool-refill", daemon=True)
            self._thread.start()

    def _next_key(self) -> Key | None:
        """The key with the largest shortfall, or None when every key is full (under the lock)."""
        short = {k: self.size - len(q) - self._starting[k] for k, q in self._idle.items()}
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
