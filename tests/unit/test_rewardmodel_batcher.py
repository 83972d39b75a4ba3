"""The local reward-model server's micro-batcher: concurrent requests share one call of the batch function, up to
`max_batch`; a failing batch fails each of its callers and the next batch runs. (The batch function here is a
plain function, so the batching logic is tested without a model; the integration test runs it on SmolLM2.)"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from trajflow.rewards.models.batcher import Batcher


async def test_concurrent_requests_share_batches_up_to_max_batch() -> None:
    calls: list[list[int]] = []

    def double(items: Sequence[int]) -> list[int]:
        calls.append(list(items))
        return [2 * i for i in items]

    batcher = Batcher(double, max_batch=4, max_wait_ms=200)
    try:
        results = await asyncio.gather(*(batcher.submit(i) for i in range(10)))
    finally:
        await batcher.close()
    assert [r for r, _ in results] == [2 * i for i in range(10)]
    assert sorted(len(c) for c in calls) == [2, 4, 4] and sorted(sum(calls, [])) == list(range(10))
    assert [size for _, size in results].count(4) == 8
    assert batcher.stats.requests == 10 and batcher.stats.batches == 3 and batcher.stats.sizes == {4: 2, 2: 1}


async def test_a_failing_batch_fails_its_callers_and_the_next_one_runs() -> None:
    def picky(items: Sequence[int]) -> list[int]:
        if 13 in items:
            raise RuntimeError("unlucky")
        return list(items)

    batcher = Batcher(picky, max_batch=8, max_wait_ms=50)
    try:
        bad = await asyncio.gather(batcher.submit(13), batcher.submit(1), return_exceptions=True)
        good = await batcher.submit(2)
    finally:
        await batcher.close()
    assert all(isinstance(b, RuntimeError) for b in bad)
    assert good == (2, 1)


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        Batcher(list, max_batch=0, max_wait_ms=1)
