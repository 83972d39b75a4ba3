"""OpenAIEngine without a server: the `[model.openai]` config, the error classification of every status and of
answers that lack what the engine asked for (scripted with httpx's MockTransport), the API key, the refusal of a
server that reports T = 1 logprobs, and the decode activity's mapping of engine errors to Temporal error types.
The real server (`vllm serve`) is in tests/integration/test_openai_engine.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from trajflow.contracts import names
from trajflow.contracts.config import ModelConfig, OpenAIServerConfig, load_run_config
from trajflow.contracts.trajectory import GenerateInput, SamplingParams
from trajflow.rl.engines.base import EngineError, EngineMisconfigured, EngineRequestRejected, EngineUnavailable
from trajflow.rl.engines.openai import OpenAIEngine

SERVER = OpenAIServerConfig(base_url="http://server.test/v1/", served_model="tiny", policy_version=2, startup_wait_s=0)
EOS = 2


def completion(ids: list[int], finish: str = "length", **overrides: Any) -> dict[str, Any]:
    """A vLLM-shaped completions answer for `ids`."""
    logprobs = {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-1.5] * len(ids)}
    choice = {"index": 0, "text": "", "logprobs": logprobs, "finish_reason": finish, "token_ids": ids, **overrides}
    return {"choices": [choice]}


def models(*served: str) -> dict[str, Any]:
    return {"data": [{"id": name, "max_model_len": 512} for name in served]}


def scripted(
    tiny_model: Path, answer: Callable[[httpx.Request], httpx.Response], api_key: str | None = None
) -> OpenAIEngine:
    return OpenAIEngine(SERVER, tiny_model, api_key=api_key, transport=httpx.MockTransport(answer))


def always(status: int, body: Any) -> Callable[[httpx.Request], httpx.Response]:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return lambda request: httpx.Response(status, content=content)


def test_openai_section_goes_with_the_openai_engine() -> None:
    section = {"base_url": "http://h:8000/v1", "served_model": "m"}
    model = ModelConfig.model_validate({"engine": "openai", "openai": section})
    assert model.openai == OpenAIServerConfig.model_validate(section)
    with pytest.raises(ValueError, match=r"needs a \[model.openai\] section"):
        ModelConfig(engine="openai")
    with pytest.raises(ValueError, match='engine = "hf"'):
        ModelConfig.model_validate({"openai": section})
    with pytest.raises(ValueError, match=r"base_url\n.*must be an http:// or https:// URL"):
        OpenAIServerConfig(base_url="127.0.0.1:8000", served_model="m")
    with pytest.raises(ValueError, match="served_model"):
        OpenAIServerConfig(base_url="http://h/v1", served_model="")
    with pytest.raises(ValueError, match="api_key"):  # the key is a process setting, never in the config file
        OpenAIServerConfig.model_validate({**section, "api_key": "sk-secret"})


def test_a_run_config_names_its_server(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[model]\nengine = "openai"\nname_or_path = "tiny"\n[model.openai]\nbase_url = "https://x/v1/"\n'
                    'served_model = "qwen"\npolicy_version = 7\n')  # fmt: skip
    server = load_run_config(path).model.openai
    assert server is not None and (server.base_url, server.served_model, server.policy_version) == (
        "https://x/v1",
        "qwen",
        7,
    )


async def test_a_completion_is_parsed_and_sent_as_token_ids(tiny_model: Path) -> None:
    sent: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer sk-test"
        sent.append(json.loads(request.content))
        return httpx.Response(200, json=completion([7, 8, EOS, 9]))

    engine = scripted(tiny_model, answer, api_key="sk-test")
    result = await engine.generate([5, 6], SamplingParams(temperature=0.5, top_p=0.9, max_new_tokens=4), "run-x")
    await engine.close()
    body = sent[0]
    assert body["prompt"] == [5, 6] and body["model"] == "tiny" and body["stop_token_ids"] == [EOS]
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["logprobs"]) == (0.5, 0.9, 4, 0)
    assert body["return_tokens_as_token_ids"] and body["repetition_penalty"] == 1.0
    # cut after the EOS, which is kept; the version is the configured one whatever the policy
    assert (result.token_ids, result.logprobs, result.finish_reason, result.policy_version) == (
        [7, 8, EOS], [-1.5] * 3, "stop", 2,
    )  # fmt: skip
    assert engine.available_version("run-x") == 2
    assert "seed" not in body  # unseeded: the server's own generator


async def test_a_seeded_request_sends_its_seed(tiny_model: Path) -> None:
    sent: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json=completion([7]))

    engine = scripted(tiny_model, answer)
    await engine.generate([5, 6], SamplingParams(max_new_tokens=1, seed=2**53 - 1))
    await engine.close()
    assert sent[0]["seed"] == 2**53 - 1


@pytest.mark.parametrize(
    ("status", "error"),
    [(400, EngineRequestRejected), (413, EngineRequestRejected), (422, EngineRequestRejected),
     (401, EngineMisconfigured), (403, EngineMisconfigured), (404, EngineMisconfigured), (418, EngineMisconfigured),
     (408, EngineUnavailable), (429, EngineUnavailable), (500, EngineUnavailable), (503, EngineUnavailable)],
)  # fmt: skip
async def test_statuses_are_classified_with_the_servers_message(
    tiny_model: Path, status: int, error: type[EngineError]
) -> None:
    engine = scripted(tiny_model, always(status, {"error": {"message": "the server's reason", "code": status}}))
    with pytest.raises(error, match=f"{status}.*the server's reason") as raised:
        await engine.generate([5], SamplingParams())
    await engine.close()
    assert raised.value.retryable is (error is EngineUnavailable)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"choices": []}, "exactly one choice"),
        (completion([7], logprobs=None), "without logprobs"),
        (completion([7], logprobs={"tokens": ["hello"], "token_logprobs": [-1.0]}), "not `token_id:N`"),
        (completion([7, 8], logprobs={"tokens": ["token_id:7", "token_id:8"], "token_logprobs": [-1.0]}), "pair up"),
        (completion([7], logprobs={"tokens": ["token_id:7"], "token_logprobs": [None]}), "missing, NaN or positive"),
        (completion([7], token_ids=[8]), "disagree"),
        (completion([7, 9], "stop"), "does not call EOS"),
        (b"<html>oops</html>", "not JSON"),
    ],
)
async def test_answers_without_what_was_asked_for_are_misconfigurations(tiny_model: Path, body: Any, why: str) -> None:
    engine = scripted(tiny_model, always(200, body))
    with pytest.raises(EngineMisconfigured, match=why):
        await engine.generate([5], SamplingParams(max_new_tokens=8))
    await engine.close()


async def test_an_aborted_completion_is_retryable(tiny_model: Path) -> None:
    engine = scripted(tiny_model, always(200, completion([7], "abort")))
    with pytest.raises(EngineUnavailable, match="'abort'"):
        await engine.generate([5], SamplingParams())
    await engine.close()


def probing(tiny_model: Path, served: str, best: Callable[[float], float]) -> OpenAIEngine:
    """A server listing `served`, whose top-1 logprob at temperature T is best(T)."""

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json=models(served))
        body = json.loads(request.content)
        top = [{"token_id:7": best(body["temperature"]), "token_id:9": -9.0}]
        return httpx.Response(200, json=completion([9], logprobs={"tokens": ["token_id:9"], "token_logprobs": [-9.0],
                                                                  "top_logprobs": top}))  # fmt: skip

    return scripted(tiny_model, answer)


async def test_start_checks_the_model_and_the_logprobs_mode(tiny_model: Path) -> None:
    processed = probing(tiny_model, "tiny", lambda t: -2.0 * t)
    await processed.start()
    assert processed.max_model_len == 512
    with pytest.raises(EngineMisconfigured, match=r"serves \['other'\], not 'tiny'"):
        await probing(tiny_model, "other", lambda t: -2.0 * t).start()
    with pytest.raises(EngineMisconfigured, match="--logprobs-mode processed_logprobs"):
        await probing(tiny_model, "tiny", lambda t: -2.0).start()


async def test_decode_activity_maps_engine_errors(tiny_model: Path, tmp_path: Path) -> None:
    from temporalio.exceptions import ApplicationError
    from temporalio.testing import ActivityEnvironment

    from trajflow.activities.decode import DecodeActivities
    from trajflow.infra.store import LocalStore

    inp = GenerateInput(trajectory_id="t", turn=0, context_uri=None, user_message="hi")
    for status, kind, retryable in [
        (503, names.ERR_ENGINE_UNAVAILABLE, True),
        (400, names.ERR_BAD_REQUEST, False),
        (401, names.ERR_ENGINE_MISCONFIGURED, False),
    ]:
        engine = scripted(tiny_model, always(status, {"error": {"message": "no"}}))
        activities = DecodeActivities(engine, LocalStore(tmp_path / "store"), "p", "w")
        with pytest.raises(ApplicationError) as raised:
            await ActivityEnvironment().run(activities.generate, inp)
        await engine.close()
        assert (raised.value.type, raised.value.non_retryable) == (kind, not retryable)


async def test_load_engine_builds_the_client_with_the_key(tiny_model: Path) -> None:
    from trajflow.rl.engines.load import load_engine

    model = ModelConfig(name_or_path=str(tiny_model), engine="openai", openai=SERVER, max_batch=4)
    engine = load_engine(model, cache_dir=tiny_model.parent, api_key="sk-1")
    assert isinstance(engine, OpenAIEngine)
    assert (engine.name, engine.version, engine._http.headers["authorization"]) == ("tiny", 2, "Bearer sk-1")
    await engine.close()
