"""The warm pool's count of sandboxes, against a stand-in manager: a take in progress is never counted as neither
waiting nor out, so the refill starts no sandbox a returning one makes surplus. (That the pool keeps real
containers warm and reuses them is tested against Docker in tests/integration/test_sandbox_hardening.py.)"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, cast

from tests.conftest import ManualClock
from trajflow.sandbox.errors import SandboxLost
from trajflow.sandbox.manager import Sandbox, SandboxManager
from trajflow.sandbox.pool import WarmPool

GAME = "game:GuessTheNumber-v0-easy"
OTHER = "game:Mastermind-v0-easy"


class Leases:
    def release(self, sandbox_id: str) -> bool:
        return True


class Manager:
    """What `WarmPool` calls on a `SandboxManager`; `get` can be held to widen the window in which a take checks
    a waiting sandbox."""

    image = "trajflow-env:test"
    start_timeout_s = 5.0

    def __init__(self) -> None:
        self.leases = Leases()
        self.boxes: dict[str, Sandbox] = {}
        self.started = 0
        self.hold_get = threading.Event()
        self.hold_get.set()
        self.in_get = threading.Event()

    def start(self, env_hint: str = "", image: str | None = None) -> Sandbox:
        self.started += 1
        box = Sandbox(cast(Any, None), f"box-{self.started}", f"c-{self.started}", Path("/nonexistent"), 1.0)
        self.boxes[box.id] = box
        return box

    def get(self, sandbox_id: str) -> Sandbox:
        self.in_get.set()
        self.hold_get.wait(5)
        if sandbox_id not in self.boxes:
            raise SandboxLost(sandbox_id, "gone")
        return self.boxes[sandbox_id]

    def close(self, sandbox_id: str) -> None:
        self.boxes.pop(sandbox_id, None)

    def sandbox_ids(self) -> list[str]:
        return list(self.boxes)


def _settle(pool: WarmPool, manager: Manager) -> None:
    """Give the refill thread time to act on what it was told (it starts at once when it is short)."""
    time.sleep(0.3)
    assert pool.stats.refill_failures == 0, manager.started


def test_checking_a_waiting_sandbox_does_not_make_the_refill_replace_it() -> None:
    manager = Manager()
    pool = WarmPool(cast(SandboxManager, manager), size=1, reuse=3)
    try:
        assert pool.wait_full(GAME, timeout_s=5) and manager.started == 1
        manager.hold_get.clear()  # the take will sit in its check of the waiting sandbox
        taken: list[Sandbox] = []
        taker = threading.Thread(target=lambda: taken.append(pool.take(GAME)))
        taker.start()
        assert manager.in_get.wait(5)
        _settle(pool, manager)
        assert manager.started == 1  # the sandbox being checked will come back: nothing to replace
        manager.hold_get.set()
        taker.join(5)
        assert pool.give_back(taken[0].id) and pool.idle_count(GAME) == 1
        _settle(pool, manager)
        assert manager.started == 1 and pool.idle_count(GAME) == 1
    finally:
        pool.close()


def test_a_cold_take_that_comes_back_leaves_one_waiting_and_a_used_up_one_is_replaced() -> None:
    for _ in range(20):  # the old race was a thread switch wide: try it often
        manager = Manager()
        pool = WarmPool(cast(SandboxManager, manager), size=1, reuse=2)
        try:
            box = pool.take(GAME)  # nothing waits yet: a cold start
            assert pool.give_back(box.id) and pool.idle_count(GAME) == 1
            _settle(pool, manager)
            assert manager.started == 1
            again = pool.take(GAME)
            assert again is box and again.served == 2  # used up: it will not come back
            assert pool.wait_full(GAME, timeout_s=5) and manager.started == 2
        finally:
            pool.close()


def test_a_sandbox_being_given_back_is_not_replaced_while_its_return_is_checked() -> None:
    manager = Manager()
    pool = WarmPool(cast(SandboxManager, manager), size=1, reuse=3)
    try:
        box = pool.take(GAME)  # a cold start: out, and coming back
        _settle(pool, manager)
        assert manager.started == 1
        manager.hold_get.clear()  # the give-back will sit in its check of the returned sandbox
        kept: list[bool] = []
        giver = threading.Thread(target=lambda: kept.append(pool.give_back(box.id)))
        giver.start()
        assert manager.in_get.wait(5)
        pool.take(OTHER)  # another env's cold take wakes the refill while GAME's sandbox is on its way back
        _settle(pool, manager)
        assert manager.started == 2  # OTHER's own: nothing started for GAME, whose sandbox is coming back
        manager.hold_get.set()
        giver.join(5)
        assert kept == [True] and pool.idle_count(GAME) == 1
        _settle(pool, manager)
        assert manager.started == 2 and pool.idle_count(GAME) == 1
    finally:
        manager.hold_get.set()
        pool.close()


def test_a_dead_waiting_sandbox_is_discarded_and_replaced() -> None:
    manager = Manager()
    pool = WarmPool(cast(SandboxManager, manager), size=1, reuse=3)
    try:
        assert pool.wait_full(GAME, timeout_s=5)
        manager.boxes.clear()  # it died while it waited
        box = pool.take(GAME)
        assert pool.stats.discarded_dead == 1 and pool.stats.cold_starts == 1 and box.id == "box-2"
        assert pool.give_back(box.id)
        _settle(pool, manager)
        assert manager.started == 2 and pool.idle_count(GAME) == 1
    finally:
        pool.close()


def test_a_key_nobody_asks_for_is_forgotten_and_a_take_asks_for_it_again() -> None:
    manager, clock = Manager(), ManualClock()
    pool = WarmPool(cast(SandboxManager, manager), size=1, reuse=3, unused_s=60, clock=clock)
    try:
        assert pool.wait_full(GAME, timeout_s=5) and pool.wait_full(OTHER, timeout_s=5) and manager.started == 2
        clock.now += 30
        out = pool.take(OTHER)  # OTHER is asked for again; its sandbox is out and will come back
        clock.now += 45  # GAME unused for 75 s, OTHER for 45 s
        assert pool.forget_unused() == 1 and pool.stats.forgotten == 1
        _settle(pool, manager)
        assert pool.idle_count(GAME) == 0 and manager.started == 2  # GAME's sandbox closed and not started again
        assert list(manager.boxes) == [out.id]  # OTHER's, out (no replacement: it comes back)
        clock.now += 100
        assert pool.forget_unused() == 0  # OTHER has a sandbox out: kept, whatever its age
        assert pool.give_back(out.id)
        clock.now += 100
        assert pool.idle_count(OTHER) == 1
        assert pool.forget_unused() == 1 and not manager.boxes  # now nothing of it is out
        cold = pool.stats.cold_starts
        again = pool.take(GAME)  # asked for again: a cold start, and its sandbox waits for the next take once more
        assert pool.stats.cold_starts == cold + 1
        assert pool.give_back(again.id) and pool.idle_count(GAME) == 1
    finally:
        pool.close()


def test_all_keys_together_keep_at_most_max_waiting() -> None:
    manager = Manager()
    pool = WarmPool(cast(SandboxManager, manager), size=2, reuse=3, max_waiting=3)
    try:
        assert pool.wait_full(GAME, timeout_s=5)
        assert not pool.wait_full(OTHER, timeout_s=1)  # room for one more only
        assert pool.idle_count(GAME) + pool.idle_count(OTHER) == 3 == manager.started
        box = pool.take(OTHER)  # a waiting one: the refill may start one in its place, no more
        _settle(pool, manager)
        assert pool.idle_count(GAME) + pool.idle_count(OTHER) == 3
        assert not pool.give_back(box.id)  # three wait already: the returned one is closed
        _settle(pool, manager)
        assert pool.idle_count(GAME) + pool.idle_count(OTHER) == 3 and len(manager.boxes) == 3
    finally:
        pool.close()
