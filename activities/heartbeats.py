"""Heartbeats while an activity awaits slow work, so the server notices a dead worker by the heartbeat timeout
(seconds) instead of the start-to-close timeout (minutes)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from temporalio import activity

T = TypeVar("T")
QUICK_EVERY_S = 3.0
"""For the activities that usually take well under a second (env step and close, score, save): a fifth of their
heartbeat timeout in workflows/stubs.py, so a worker killed while running one is noticed in seconds, not after
the start-to-close timeout (a minute), which stalled the whole run behind one trajectory."""


async def with_heartbeats(work: Awaitable[T], detail: str, every_s: float) -> T:
    """Await `work`, heartbeating `detail` every `every_s` seconds until it ends; cancelling this cancels it."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every_s)
            if done:
                return task.result()
            activity.heartbeat(detail)
    finally:
        task.cancel()
