"""`OpenAIEngine`: the `Engine` protocol over an existing inference server's OpenAI-compatible completions API
(vLLM's `vllm serve`; SGLang's where it answers with token ids), serving a *frozen* policy for evaluation and
rollouts.

Each `generate` is one `POST {base_url}/completions` whose prompt is the token ids themselves (never re-tokenised
text), asking for the sampled tokens' ids and logprobs back: `logprobs: 0` (the sampled token's own logprob, no
alternatives), `return_tokens_as_token_ids` (tokens come back as `token_id:N`) and `return_token_ids` (vLLM's
`token_ids` list; checked against the `token_id:N` tokens when both come). EOS ids come from the local tokenizer
and model config (as in `HFEngine`) and are sent as `stop_token_ids`; a completion ending in one keeps it
(finish_reason "stop"), else "length". `text` is decoded locally without special tokens.

The policy is frozen: every completion reports `OpenAIServerConfig.policy_version`, whatever policy a request names,
and no weights are ever loaded (this process holds only the tokenizer, which the decode activity needs for chat
formatting and which must be the served model's). A training run whose trainer publishes newer versions cannot
decode on such a pool: its requests would wait for a version this engine never reaches (`PolicyVersionBehind`,
retried); use it for evaluation and rollout pools.

Logprob semantics are the server's. vLLM reports the T = 1 distribution at every temperature unless started with
`--logprobs-mode processed_logprobs` (then `log_softmax(logits / T)`, as `HFEngine` and `VLLMEngine`): start
it with that flag. `start()` checks it: a server that reports the same logprob at two temperatures is refused
(`EngineMisconfigured`). Every request sets top-k, min-p and the penalties to their neutral values, so the
server's own sampling defaults (vLLM reads them from the checkpoint's generation_config.json) change nothing. As
in `VLLMEngine`, with `top_p < 1` the logprob is the truncated, renormalised distribution's.

Errors, classified once (`trajflow.rl.engines.base`): connection refused or reset, the `request_timeout_s` deadline, a
5xx, 408 or 429 are `EngineUnavailable` (retryable); 400, 413, 422 (the request is wrong, e.g. longer than the
server's context) `EngineRequestRejected`; 401, 403, 404, other 4xx, and an answer without the ids or logprobs
asked for `EngineMisconfigured`.

At most `max_in_flight` requests are sent at once (the server batches them); more wait for a slot, and the
deadline starts when one is sent. Limits: one completion per request (`n = 1`); no streaming, so a cancelled
request is cancelled by closing its connection (vLLM then aborts it). `SamplingParams.seed` is sent as the API's
`seed` (vLLM seeds that request's own generator with it); what it guarantees is the server's.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from trajflow.contracts.config import OpenAIServerConfig
from trajflow.contracts.trajectory import SamplingParams
from trajflow.rl.engines.base import (
    Completion,
    EngineMisconfigured,
    EngineRequestRejected,
    EngineUnavailable,
    eos_ids,
    trim_at_eos,
)

_SNIPPET = 300
"""How much of an unexpected answer an error message quotes."""
_NEUTRAL = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
"""Sent with every request so that a server's own sampling defaults (vLLM takes them from the checkpoint's
generation_config.json) never reshape the distribution tokens are sampled from."""
_PROBE_TEMPERATURES = (1.0, 0.25)
"""Two temperatures at which the most likely next token must get different logprobs when the server reports
`log_softmax(logits / T)`."""


@dataclass
class _Stats:
    requests: int = 0
    completion_tokens: int = 0
    failures: int = 0
    busy_s: float = 0.0
    """Wall time with at least one request at the server."""
    max_in_flight: int = 0

    def as_dict(self) -> dict[str, float]:
        return {
            "requests": float(self.requests),
            "completion_tokens": float(self.completion_tokens),
            "failures": float(self.failures),
            "busy_s": self.busy_s,
            "tokens_per_s": self.completion_tokens / self.busy_s if self.busy_s > 0 else 0.0,
            "max_in_flight": float(self.max_in_flight),
        }


def _server_message(response: httpx.Response) -> str:
    """The error message of an OpenAI-style error body (`{"error": {"message": ...}}`, or `message`/`detail`)."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.text[:_SNIPPET] or response.reason_phrase
    if isinstance(body, dict):
        inner = body.get("error")
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return inner["message"][: 4 * _SNIPPET]
        for field in ("message", "detail"):
            if isinstance(body.get(field), str):
                return body[field][: 4 * _SNIPPET]
    return response.text[:_SNIPPET]


class OpenAIEngine:
    """A frozen policy behind an OpenAI-compatible server; see the module docstring."""

    def __init__(
        self,
        server: OpenAIServerConfig,
        tokenizer_path: Path,
        *,
        api_key: str | None = None,
        max_in_flight: int = 32,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """`tokenizer_path`: a local checkpoint directory with the served model's tokenizer (its config.json adds
        EOS ids where it names any). `transport` is for tests."""
        from transformers import AutoConfig, AutoTokenizer

        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.server = server
        self.name = server.served_model
        self.version = server.policy_version
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        config = (
            AutoConfig.from_pretrained(tokenizer_path) if (Path(tokenizer_path) / "config.json").is_file() else None
        )
        self._eos = eos_ids(self.tokenizer, config)
        self.max_model_len: int | None = None
        """The server's context length, when its model list says (vLLM does); known after `start()`."""
        self.follows_training = False  # frozen: see the module docstring
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=server.base_url,
            headers=headers,
            timeout=server.request_timeout_s,
            limits=httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=max_in_flight),
            transport=transport,
        )
        self._slots = asyncio.Semaphore(max_in_flight)
        self._in_flight = 0
        self._busy_since = 0.0
        self._started = False
        self._stats = _Stats()

    async def start(self) -> None:
        """Wait (up to `startup_wait_s`) for the server to answer, then check that it serves `served_model` and
        answers a token prompt with token ids and temperature-scaled logprobs. Idempotent."""
        if self._started:
            return
        deadline = time.monotonic() + self.server.startup_wait_s
        while True:
            try:
                models = await self._request("GET", "/models")
                break
            except EngineUnavailable:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
        cards = models.get("data") if isinstance(models, dict) else None
        served = {c.get("id"): c for c in cards if isinstance(c, dict)} if isinstance(cards, list) else {}
        if self.name not in served:
            raise EngineMisconfigured(
                f"the server at {self.server.base_url} serves {sorted(map(str, served))}, not {self.name!r}: "
                "set [model.openai].served_model to one of them"
            )
        length = served[self.name].get("max_model_len")
        self.max_model_len = length if isinstance(length, int) else None
        await self._check_logprobs()
        self._started = True

    async def close(self) -> None:
        """Close the connection pool; requests still waiting fail."""
        await self._http.aclose()

    @property
    def max_positions(self) -> int | None:
        """The server's context length (`max_model_len`, known after `start()`), None when it does not say."""
        return self.max_model_len

    def stats(self) -> dict[str, float]:
        return self._stats.as_dict()

    def available_version(self, policy: str) -> int:
        return self.version

    async def generate(self, prompt_ids: list[int], params: SamplingParams, policy: str = "") -> Completion:
        """One completion of `prompt_ids` from the served (frozen) policy; `policy` is not used."""
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        self._stats.requests += 1
        async with self._slots:
            self._enter()
            try:
                ids, logprobs = await self._complete(list(prompt_ids), params)
            except BaseException:
                self._stats.failures += 1
                raise
            finally:
                self._leave()
        ids, logprobs, reason = trim_at_eos(ids, logprobs, set(self._eos))
        self._stats.completion_tokens += len(ids)
        text = str(self.tokenizer.decode(ids, skip_special_tokens=True))
        return Completion(ids, logprobs, text, reason, self.version)

    async def _complete(self, prompt_ids: list[int], params: SamplingParams) -> tuple[list[int], list[float]]:
        """The sampled token ids and their logprobs; raises an `EngineError` for anything else."""
        body = {
            "model": self.name,
            "prompt": prompt_ids,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            **({"seed": params.seed} if params.seed is not None else {}),
            **_NEUTRAL,
            "n": 1,
            "stream": False,
            "logprobs": 0,
            "stop_token_ids": self._eos,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
        }
        answer = await self._request("POST", "/completions", body)
        return self._parse(answer, params.max_new_tokens)

    def _parse(self, answer: Any, max_tokens: int) -> tuple[list[int], list[float]]:
        def bad(why: str) -> EngineMisconfigured:
            return EngineMisconfigured(
                f"the server at {self.server.base_url} answered a completion {why}; it must return the sampled "
                f"token ids and their logprobs (vLLM's OpenAI server does): {json.dumps(answer)[:_SNIPPET]}"
            )

        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            raise bad("without exactly one choice")
        choice = choices[0]
        if choice.get("finish_reason") not in ("stop", "length"):
            # e.g. "abort": the server dropped the request (shutting down, preempted); it may serve it later
            raise EngineUnavailable(
                f"the server at {self.server.base_url} ended a completion with finish_reason "
                f"{choice.get('finish_reason')!r}"
            )
        raw = choice.get("logprobs")
        if not isinstance(raw, dict) or not isinstance(raw.get("tokens"), list):
            raise bad("without logprobs")
        tokens, values = raw["tokens"], raw.get("token_logprobs")
        if not isinstance(values, list) or len(values) != len(tokens) or not 0 < len(tokens) <= max_tokens:
            raise bad(f"with {len(tokens)} tokens and logprobs that do not pair up (max_tokens {max_tokens})")
        try:
            ids = [int(str(t).removeprefix("token_id:")) for t in tokens]
        except ValueError:
            raise bad("with tokens as text, not `token_id:N` (return_tokens_as_token_ids unsupported?)") from None
        listed = choice.get("token_ids")
        if listed is not None and listed != ids:
            raise bad("whose token_ids disagree with its logprobs' tokens")
        if not all(isinstance(v, (int, float)) and not math.isnan(v) and v <= 1e-4 for v in values):
            raise bad("with a logprob that is missing, NaN or positive")
        last = ids[-1]
        if choice["finish_reason"] == "stop" and last not in self._eos:
            raise EngineMisconfigured(
                f"the server at {self.server.base_url} stopped a completion at token {last}, which the local "
                f"tokenizer does not call EOS ({self._eos}): it is not the served model's tokenizer"
            )
        return ids, [float(v) for v in values]

    async def _check_logprobs(self) -> None:
        """Refuse a server that reports T = 1 logprobs at every temperature (vLLM's default `raw_logprobs`): the
        most likely next token's logprob must rise when the temperature falls, unless it is already ~0."""
        prompt = list(self.tokenizer.encode("The", add_special_tokens=False)) or [self._eos[0]]
        best = []
        for temperature in _PROBE_TEMPERATURES:
            body = {"model": self.name, "prompt": prompt, "max_tokens": 1, "temperature": temperature, **_NEUTRAL}
            body["logprobs"] = 1
            answer = await self._request("POST", "/completions", body)
            try:
                top = answer["choices"][0]["logprobs"]["top_logprobs"][0]
                best.append(max(float(v) for v in top.values()))
            except (KeyError, IndexError, TypeError, ValueError, AttributeError):
                raise EngineMisconfigured(
                    f"the server at {self.server.base_url} answered a completion with `logprobs: 1` without the "
                    f"top logprobs: {json.dumps(answer)[:_SNIPPET]}"
                ) from None
        if abs(best[0] - best[1]) < 1e-6 and best[0] < -1e-3:
            raise EngineMisconfigured(
                f"the server at {self.server.base_url} reports the same logprob ({best[0]:.4f}) at temperatures "
                f"{_PROBE_TEMPERATURES}: it reports the T = 1 distribution, not the one tokens are sampled from; "
                "start vLLM with `--logprobs-mode processed_logprobs`"
            )

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One request under the whole-request deadline; the JSON of a 2xx answer, else a classified error."""
        url = f"{self.server.base_url}{path}"
        timeout_s = self.server.request_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                response = await self._http.request(method, path, json=body)
        except TimeoutError:
            raise EngineUnavailable(f"{method} {url}: no answer within {timeout_s} s") from None
        except httpx.TransportError as e:  # connection refused/reset and httpx's own per-phase timeouts
            raise EngineUnavailable(f"{method} {url}: {type(e).__name__}: {e or 'no detail'}") from e
        status = response.status_code
        if status >= 500 or status in (408, 429):
            raise EngineUnavailable(f"{method} {url} answered {status}: {_server_message(response)}")
        if status in (400, 413, 422):
            raise EngineRequestRejected(f"{method} {url} refused the request ({status}): {_server_message(response)}")
        if not 200 <= status < 300:
            raise EngineMisconfigured(f"{method} {url} answered {status}: {_server_message(response)}")
        try:
            return response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise EngineMisconfigured(
                f"{method} {url} answered {status} with a body that is not JSON: {response.text[:_SNIPPET]!r}"
            ) from None

    def _enter(self) -> None:
        if self._in_flight == 0:
            self._busy_since = time.monotonic()
        self._in_flight += 1
        self._stats.max_in_flight = max(self._stats.max_in_flight, self._in_flight)

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._stats.busy_s += time.monotonic() - self._busy_since
