"""An LLM judge through a real OpenAI-compatible server: `vllm serve` (from `.vllm-venv`, as in
`test_openai_engine.py`: the `vllm_server` fixture of tests/integration/conftest.py) serving the tiny random model,
called by the reward service for `reward_fn = "model:judge"`.

The tiny model's judgement means nothing, so the plumbing is asserted: the same chat request sent straight to the
server (temperature 0) gives the reply the service saw; when that reply holds a number, the reward is that number
normalised and the details record it; when it holds none, the service answers 502 quoting it, never a zero. A
judge with the wrong API key is 502 too. Skips without `.vllm-venv` unless `TRAJFLOW_REQUIRE_VLLM=1`.
"""

from __future__ import annotations

import httpx
import pytest

from tests.integration.vllm_serve import API_KEY, Server
from trajflow.contracts.reward_models import JudgeModelConfig
from trajflow.contracts.scoring import ScoreRequest
from trajflow.rewards.judge import judge_prompt, normalise, parse_score
from trajflow.rewards.service import create_app

pytestmark = pytest.mark.integration

TEMPLATE = "Rate from 0 to 1000000 how well this answers {prompt}: {response}\nRating:"


def spec(server: Server, key_env: str = "TRAJFLOW_TEST_JUDGE_KEY") -> JudgeModelConfig:
    return JudgeModelConfig(
        base_url=server.base_url, model="tiny", api_key_env=key_env, template=TEMPLATE, score_format="last_number",
        min_score=0, max_score=1_000_000, max_tokens=24,
    )  # fmt: skip


async def test_the_reward_is_what_the_judges_reply_says(vllm_server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJFLOW_TEST_JUDGE_KEY", API_KEY)
    judge = spec(vllm_server)
    req = ScoreRequest(
        env_id="data:x", reward_fn="model:judge", reward_model=judge, actions=["5"], observations=["2 + 3"]
    )
    body = {"model": "tiny", "messages": [{"role": "user", "content": judge_prompt(req, judge)}], "max_tokens": 24,
            "temperature": 0.0}  # fmt: skip
    async with httpx.AsyncClient(timeout=120) as http:
        direct = await http.post(f"{vllm_server.base_url}/chat/completions", json=body,
                                 headers={"authorization": f"Bearer {API_KEY}"})  # fmt: skip
        assert direct.status_code == 200, direct.text
        reply = direct.json()["choices"][0]["message"]["content"]
        transport = httpx.ASGITransport(app=create_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://reward") as service:
            res = await service.post(
                "/score", content=req.model_dump_json(), headers={"content-type": "application/json"}
            )
    try:
        raw = parse_score(reply, judge)
    except ValueError:
        raw = None
    if raw is None:
        assert res.status_code == 502 and reply[-50:] in res.json()["message"], (reply, res.text)
    else:
        assert res.status_code == 200, res.text
        assert res.json()["reward"] == pytest.approx(normalise(raw, judge))
        assert res.json()["details"]["judge_score"] == raw and res.json()["details"]["judge_reply"] == reply[-200:]


async def test_a_wrong_api_key_is_a_judge_failure(vllm_server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJFLOW_TEST_JUDGE_KEY", "wrong-key")
    req = ScoreRequest(env_id="data:x", reward_fn="model:judge", reward_model=spec(vllm_server), actions=["5"],
                       observations=["2 + 3"])  # fmt: skip
    transport = httpx.ASGITransport(app=create_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://reward") as service:
        res = await service.post("/score", content=req.model_dump_json(), headers={"content-type": "application/json"})
    assert res.status_code == 502 and "401" in res.json()["message"]
