"""The async client of the reward service: `await RewardClient(url).score(req)`, errors classified once.

Every failure is one of three `RewardError` types, each saying whether a retry can help (`retryable`):

| error | when | retryable |
|---|---|---|
| `RewardServiceUnavailable` | connection refused/reset, the `timeout_s` deadline passed, a 5xx, a 408 or 429 | yes |
| `RewardRequestRejected` | any other 4xx: the request is wrong (unknown reward_fn, bad fields) | no |
| `RewardVerifierTimedOut` | 422, `error: "VerifierTimedOut"`: a verifier overran its time limit on this answer | no |
| `RewardServiceBadAnswer` | a 2xx whose body is not a valid `ScoreResult` (see below), or a 1xx/3xx: a service bug | no
|

`RewardVerifierTimedOut` is a `RewardRequestRejected` (the same answer would time out again).
A body is not a valid `ScoreResult` when it is not JSON, has the wrong shape, holds a NaN or infinite reward, or is
over `MAX_ANSWER_BYTES`.

408 (request timeout) and 429 (throttled) are 4xx codes but say "try later", which serverless platforms answer
when scaling; so they count as unavailable. Callers (the `reward.score` activity) map `retryable=False` to a
non-retryable error, so a wrong request or a broken service fails fast instead of burning the retry budget,
and an outage is retried — never scored as a zero reward.

`timeout_s` bounds the whole request (connect, send, wait, read), not each phase separately.
Not covered: retries themselves (the caller's retry policy owns them), auth headers, connection tuning.
"""

from __future__ import annotations

import asyncio
import json
from types import TracebackType
from typing import ClassVar

import httpx
from pydantic import ValidationError

from trajflow.contracts import names as contract_names
from trajflow.contracts.errors import explain_invalid
from trajflow.contracts.scoring import ScoreRequest, ScoreResult

_SNIPPET = 200
"""How much of an unexpected answer an error message quotes."""
MAX_ANSWER_BYTES = 64 * 1024
"""A ScoreResult is a reward and a few details; a larger answer is garbage (and must not reach workflow history)."""


class RewardError(Exception):
    """Base of the client's errors; `retryable` says whether the same request may succeed later."""

    retryable: ClassVar[bool] = False


class RewardServiceUnavailable(RewardError):
    """The service could not be reached or answered in time, or failed on its side (5xx, 408, 429). Retryable."""

    retryable = True


class RewardRequestRejected(RewardError):
    """The service answered 4xx: the request is wrong and retrying cannot fix it. Not retryable."""

    retryable = False

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"reward service rejected the request ({status_code}): {message}")
        self.status_code = status_code
        self.service_message = message


class RewardVerifierTimedOut(RewardRequestRejected):
    """The service's verifier ran past its time limit on this request's answer and was killed (422, `error:
    "VerifierTimedOut"`). Not retryable: the same answer would time out again; and never a zero reward."""

    def __init__(self, message: str, reward_fn: str, timeout_s: float | None) -> None:
        super().__init__(422, message)
        self.reward_fn = reward_fn
        self.timeout_s = timeout_s


class RewardServiceBadAnswer(RewardError):
    """A success status with a body that is not a ScoreResult (or an unexpected status): a service bug.
    Not retryable."""

    retryable = False


def retryable_status(status: int) -> bool:
    """A 5xx, or 408 (request timeout) or 429 (throttled): the server says "try later" (see the module docstring)."""
    return status >= 500 or status in (408, 429)


def _service_message(response: httpx.Response) -> str:
    """The `message` (or `detail`) of a JSON error body, else the first characters of the body."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.text[:_SNIPPET] or response.reason_phrase
    if isinstance(body, dict):
        for field in ("message", "detail"):
            if field in body:
                value = body[field]
                return value if isinstance(value, str) else json.dumps(value)[: 4 * _SNIPPET]
    return response.text[:_SNIPPET]


def _timed_out(response: httpx.Response) -> RewardVerifierTimedOut | None:
    """The verifier timeout a 422 body reports (`error: "VerifierTimedOut"`), else None."""
    if response.status_code != 422:
        return None
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(body, dict) or body.get("error") != contract_names.ERR_VERIFIER_TIMEOUT:
        return None
    limit = body.get("timeout_s")
    timeout_s = float(limit) if isinstance(limit, (int, float)) and not isinstance(limit, bool) else None
    return RewardVerifierTimedOut(_service_message(response), str(body.get("reward_fn", "")), timeout_s)


class RewardClient:
    """Client of one reward service at `base_url` (e.g. `http://127.0.0.1:8080`). Use one per process and
    close it (or use `async with`). `transport` is for tests (e.g. `httpx.ASGITransport(app=create_app())`)."""

    def __init__(
        self, base_url: str, timeout_s: float = 10.0, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s, transport=transport)

    async def score(self, req: ScoreRequest) -> ScoreResult:
        """Score one episode; raises one of the RewardError types (see the module docstring)."""
        response = await self._request("POST", "/score", content=req.model_dump_json())
        where = f"reward service at {self.base_url} answered {response.status_code}"
        if len(response.content) > MAX_ANSWER_BYTES:
            raise RewardServiceBadAnswer(
                f"{where} with {len(response.content):,} bytes, more than the {MAX_ANSWER_BYTES:,} a ScoreResult may "
                f"take: {response.text[:_SNIPPET]!r}"
            )
        try:
            return ScoreResult.model_validate_json(response.content)
        except ValidationError as e:
            why = explain_invalid(ScoreResult, e, "fix the reward service or its reward function")
            raise RewardServiceBadAnswer(
                f"{where} with a body that is not a valid ScoreResult: {response.text[:_SNIPPET]!r}; {why}"
            ) from None

    async def reward_fns(self) -> list[str]:
        """The names of the reward functions the service knows."""
        response = await self._request("GET", "/reward-fns")
        try:
            names = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            names = None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise RewardServiceBadAnswer(f"GET /reward-fns answered {response.text[:_SNIPPET]!r}, not a list of names")
        return names

    async def _request(self, method: str, path: str, content: str | None = None) -> httpx.Response:
        """One request under the whole-request deadline; returns only 2xx responses, classifies the rest."""
        url = f"{self.base_url}{path}"
        headers = {"content-type": "application/json"} if content is not None else None
        try:
            async with asyncio.timeout(self.timeout_s):
                response = await self._http.request(method, path, content=content, headers=headers)
        except TimeoutError:
            raise RewardServiceUnavailable(f"{method} {url}: no answer within {self.timeout_s} s") from None
        except httpx.TransportError as e:  # connect/read/write errors and httpx's own per-phase timeouts
            raise RewardServiceUnavailable(f"{method} {url}: {type(e).__name__}: {e}") from e
        status = response.status_code
        if 200 <= status < 300:
            return response
        if retryable_status(status):
            raise RewardServiceUnavailable(f"{method} {url} answered {status}: {_service_message(response)}")
        if 400 <= status < 500:
            raise _timed_out(response) or RewardRequestRejected(status, _service_message(response))
        raise RewardServiceBadAnswer(f"{method} {url} answered {status}: {response.text[:_SNIPPET]!r}")

    async def close(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> RewardClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


__all__ = [
    "RewardClient",
    "RewardError",
    "RewardRequestRejected",
    "RewardServiceBadAnswer",
    "RewardServiceUnavailable",
    "RewardVerifierTimedOut",
]
