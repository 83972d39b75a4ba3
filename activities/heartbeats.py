"""Heartbeats while an activity awaits slow work, so the server notices a dead worker by the heartbeat timeout
(seconds) instead of the start-to-close timeout (minutes)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from temporalio import activity

T = TypeVar("T")


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
