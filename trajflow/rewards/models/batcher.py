"""Micro-batching of concurrent requests: an asyncio queue that collects up to `max_batch` items, or what arrived
within `max_wait_ms` of the first, and runs one blocking batch function on them in a thread.

One batch runs at a time (the model's forward pass uses every core it is given); requests that arrive meanwhile
wait for the next batch. `stats()` reports how many batches of which sizes ran, so batching can be seen from the
outside. Not covered: priorities, cancellation of a request already in a running batch, length bucketing.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")


@dataclass
class _Pending(Generic[In, Out]):
    item: In
    future: asyncio.Future[tuple[Out, int]]


@dataclass
class BatchStats:
    requests: int = 0
    batches: int = 0
    sizes: Counter[int] = field(default_factory=Counter)
    busy_s: float = 0.0
    """Seconds spent inside the batch function."""


class Batcher(Generic[In, Out]):
    """`await batcher.submit(item)` → (the batch function's output for it, the size of the batch it ran in)."""

    def __init__(self, fn: Callable[[Sequence[In]], list[Out]], max_batch: int, max_wait_ms: float) -> None:
        if max_batch < 1 or max_wait_ms < 0:
            raise ValueError(f"max_batch must be ≥ 1 and max_wait_ms ≥ 0, got {max_batch}, {max_wait_ms}")
        self.fn = fn
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000
        self.stats = BatchStats()
        self._queue: asyncio.Queue[_Pending[In, Out]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def submit(self, item: In) -> tuple[Out, int]:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop())
        future: asyncio.Future[tuple[Out, int]] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(item, future))
        return await future

    async def _collect(self) -> list[_Pending[In, Out]]:
        batch = [await self._queue.get()]
        deadline = time.monotonic() + self.max_wait_s
        while len(batch) < self.max_batch:
            left = deadline - time.monotonic()
            try:
                batch.append(self._queue.get_nowait() if left <= 0 else await asyncio.wait_for(self._queue.get(), left))
            except (TimeoutError, asyncio.QueueEmpty):
                break
        return batch

    async def _loop(self) -> None:
        while True:
            batch = [p for p in await self._collect() if not p.future.done()]  # done: its caller went away
            if not batch:
                continue
            started = time.monotonic()
            try:
                outs = await asyncio.to_thread(self.fn, [p.item for p in batch])
                if len(outs) != len(batch):
                    raise RuntimeError(f"the batch function answered {len(outs)} results for {len(batch)} items")
            except Exception as e:  # every caller of this batch gets the error; the loop goes on
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(e)
                continue
            finally:
                self.stats.busy_s += time.monotonic() - started
            self.stats.requests += len(batch)
            self.stats.batches += 1
            self.stats.sizes[len(batch)] += 1
            for p, out in zip(batch, outs, strict=True):
                if not p.future.done():
                    p.future.set_result((out, len(batch)))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
