"""One JSON POST to a reward model (an LLM judge's API, a local reward-model server), its failures classified
the way the reward service answers them, so that a model that is down is retried and never scored as a zero.

- `RewardModelUnavailable` (answered 503): connection refused or reset, no whole answer within `timeout_s`, a 5xx,
  408 or 429.
- `RewardModelFailed` (answered 502): any other answer that is not a 2xx JSON object: 401/403 (a wrong key), 404 (a
  wrong URL or model name), 400 (a request the model refuses), a body that is not JSON, or a reply the scorer
  cannot read.

Both are 5xx, which the reward client (`trajflow.rewards.client`) treats as retryable: a trajectory retries and, when
the budget is spent, ends `infra_failed`, never trained on. `timeout_s` bounds the whole call, not each phase.
"""

from __future__ import annotations

import asyncio
import json

import httpx

from trajflow.rewards.client import retryable_status

EXCERPT = 200
"""How much of a model's reply details and error messages quote."""


class RewardModelUnavailable(Exception):
    """The reward model could not be reached or did not answer in time, or failed on its side (answered as 503)."""


class RewardModelFailed(Exception):
    """The reward model answered, but not with a score: misconfigured (key, URL, model name) or an unreadable reply
    (answered as 502)."""


async def post_json(url: str, body: dict, headers: dict[str, str], timeout_s: float, what: str) -> dict:
    """POST `body` to `url` and return the JSON object it answers; one of the two errors above otherwise. `what`
    names the model in messages (e.g. "judge 'qwen'")."""
    try:
        async with asyncio.timeout(timeout_s), httpx.AsyncClient(timeout=timeout_s) as http:
            response = await http.post(url, json=body, headers=headers)
    except TimeoutError:
        raise RewardModelUnavailable(f"{what} at {url}: no answer within {timeout_s} s") from None
    except httpx.TransportError as e:
        raise RewardModelUnavailable(f"{what} at {url}: {type(e).__name__}: {e}") from None
    status = response.status_code
    said = response.text[:EXCERPT]
    if retryable_status(status):
        raise RewardModelUnavailable(f"{what} at {url} answered {status}: {said!r}")
    if not 200 <= status < 300:
        hint = {401: " (check the API key)", 403: " (check the API key)", 404: " (check the URL and the model name)"}
        raise RewardModelFailed(f"{what} at {url} answered {status}{hint.get(status, '')}: {said!r}")
    try:
        answer = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        answer = None
    if not isinstance(answer, dict):
        raise RewardModelFailed(f"{what} at {url} answered {status} with a body that is not a JSON object: {said!r}")
    return answer
