"""RewardClient's error classification, against the real app in-process (ASGI) and scripted answers."""

from __future__ import annotations

import httpx
import pytest

from tests.unit.test_rewards_registry import BUILTINS
from trajflow.contracts.scoring import ScoreRequest
from trajflow.rewards.client import (
    RewardClient,
    RewardRequestRejected,
    RewardServiceBadAnswer,
    RewardServiceUnavailable,
)
from trajflow.rewards.service import create_app

REQ = ScoreRequest(env_id="game:X", actions=["a"], env_rewards=[0.5, 0.25])


def _scripted(status: int, body: bytes, content_type: str = "application/json") -> RewardClient:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body, headers={"content-type": content_type})

    return RewardClient("http://reward.test", transport=httpx.MockTransport(answer))


@pytest.mark.asyncio
async def test_score_against_the_app() -> None:
    async with RewardClient("http://reward.test", transport=httpx.ASGITransport(app=create_app())) as client:
        result = await client.score(REQ)
        assert (result.reward, result.reward_fn) == (0.75, "env_outcome")
        assert await client.reward_fns() == BUILTINS


@pytest.mark.asyncio
async def test_unknown_fn_is_rejected_with_the_service_message() -> None:
    async with RewardClient("http://reward.test", transport=httpx.ASGITransport(app=create_app())) as client:
        with pytest.raises(RewardRequestRejected) as info:
            await client.score(REQ.model_copy(update={"reward_fn": "nope"}))
    assert info.value.status_code == 404
    assert "env_outcome" in str(info.value) and "'nope'" in info.value.service_message
    assert info.value.retryable is False


@pytest.mark.parametrize("status", [500, 502, 503, 408, 429])
@pytest.mark.asyncio
async def test_5xx_and_try_later_codes_are_unavailable(status: int) -> None:
    client = _scripted(status, b'{"message": "overloaded"}')
    with pytest.raises(RewardServiceUnavailable, match="overloaded") as info:
        await client.score(REQ)
    assert info.value.retryable is True
    await client.close()


@pytest.mark.parametrize("status", [400, 401, 403, 413, 422])
@pytest.mark.asyncio
async def test_other_4xx_are_rejected(status: int) -> None:
    client = _scripted(status, b"plain text reason", content_type="text/plain")
    with pytest.raises(RewardRequestRejected, match="plain text reason") as info:
        await client.score(REQ)
    assert info.value.status_code == status
    await client.close()


@pytest.mark.parametrize(
    "body", [b"<html>hello</html>", b'{"reward": "high"}', b"[]", b'{"reward": 1.0, "reward_fn": "x", "more": 1}']
)
@pytest.mark.asyncio
async def test_a_2xx_that_is_not_a_score_result_is_a_bad_answer(body: bytes) -> None:
    client = _scripted(200, body)
    with pytest.raises(RewardServiceBadAnswer) as info:
        await client.score(REQ)
    assert body.decode()[:20] in str(info.value)
    assert info.value.retryable is False
    await client.close()


@pytest.mark.asyncio
async def test_bad_answer_quotes_at_most_200_characters() -> None:
    client = _scripted(200, b"x" * 1000)
    with pytest.raises(RewardServiceBadAnswer) as info:
        await client.score(REQ)
    assert "x" * 200 in str(info.value) and "x" * 201 not in str(info.value)
    await client.close()


@pytest.mark.asyncio
async def test_a_redirect_is_a_bad_answer() -> None:
    client = _scripted(302, b"")
    with pytest.raises(RewardServiceBadAnswer, match="302"):
        await client.score(REQ)
    await client.close()


@pytest.mark.asyncio
async def test_a_transport_error_is_unavailable() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client = RewardClient("http://reward.test", transport=httpx.MockTransport(refuse))
    with pytest.raises(RewardServiceUnavailable, match="ConnectError"):
        await client.score(REQ)
    await client.close()


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        RewardClient("http://reward.test", timeout_s=0)
