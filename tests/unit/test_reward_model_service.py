"""Reward models through the reward service: an LLM judge (and a local reward-model server) answered by a real HTTP
server started here, on a real socket, and each of its failures mapped to the service's status code and the reward
client's error class: a judge that is down (refused, too slow, 5xx, 429) is 503 and retryable, never a zero; one
that is misconfigured (401, 404) or answers no score is 502 (retryable too: the trajectory ends infra_failed); the
request's own faults are 422 and final. The stub server only plays the model's side; everything between is real."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.conftest import free_port
from trajflow.contracts.reward_models import JudgeModelConfig, LocalModelConfig
from trajflow.contracts.scoring import ScoreRequest
from trajflow.rewards.client import RewardClient, RewardRequestRejected, RewardServiceUnavailable
from trajflow.rewards.service import create_app

KEY = "judge-secret"
SEEN: list[dict] = []
"""Bodies and headers the stub received, newest last."""


class _Model(BaseHTTPRequestHandler):
    """Plays the model. The first path segment says how: `/reply-TEXT` answers a chat completion with TEXT,
    `/status-N` answers N, `/slow` sleeps 3 s, `/garbage` answers non-JSON, `/auth` wants the bearer KEY,
    `/local-R` answers a local reward model's result with reward R."""

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: object) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        SEEN.append({"path": self.path, "body": body, "auth": self.headers.get("authorization")})
        how = self.path.strip("/").split("/")[0]
        reply = httpx.URL("http://x/" + how).path[1:]  # unquoted
        if how.startswith("status-"):
            return self._send(int(how[7:]), {"error": {"message": f"stub says {how}"}})
        if how == "slow":
            time.sleep(3)
        if how == "garbage":
            return self._send(200, b"<html>not json</html>")
        if how == "auth" and self.headers.get("authorization") != f"Bearer {KEY}":
            return self._send(401, {"error": {"message": "invalid api key"}})
        if how.startswith("local-"):
            return self._send(200, {"reward": float(how[6:]), "mode": "yes_no", "raw": 0.4, "batch_size": 3})
        text = reply[6:] if reply.startswith("reply-") else "Looks right.\nScore: 8"
        self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})


@pytest.fixture(scope="module")
def model_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Model)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def judge(base_url: str, **fields: object) -> JudgeModelConfig:
    return JudgeModelConfig.model_validate({"base_url": base_url, "model": "stub-judge", **fields})


def request(spec: JudgeModelConfig | LocalModelConfig | None, **fields: object) -> ScoreRequest:
    base: dict[str, object] = {
        "env_id": "data:sums",
        "reward_fn": "model:grader",
        "reward_model": spec,
        "actions": ["I think it is 4", "\\boxed{5}"],
        "env_rewards": [0.0, 1.0],
        "observations": ["What is 2 + 3?", "Try again.", "Done."],
    }
    return ScoreRequest.model_validate({**base, **fields})


async def score(req: ScoreRequest) -> httpx.Response:
    transport = httpx.ASGITransport(app=create_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://reward") as http:
        return await http.post("/score", content=req.model_dump_json(), headers={"content-type": "application/json"})


async def test_the_reward_is_the_judges_score_normalised_with_its_reply_in_the_details(model_url: str) -> None:
    res = await score(request(judge(f"{model_url}/reply-The answer 5 is right. Score: 7/v1")))
    assert res.status_code == 200, res.text
    body = res.json()
    assert body["reward"] == pytest.approx(0.7)
    assert body["details"]["judge_score"] == 7.0 and body["details"]["judge_reply"] == "The answer 5 is right. Score: 7"
    sent = SEEN[-1]["body"]
    assert sent["model"] == "stub-judge" and sent["temperature"] == 0.0 and sent["max_tokens"] == 256
    prompt = sent["messages"][0]["content"]
    # task + last reply
    assert "What is 2 + 3?" in prompt and "\\boxed{5}" in prompt and "I think it is 4" not in prompt


async def test_a_template_with_reference_and_transcript_and_a_custom_range(model_url: str) -> None:
    template = "{transcript}\nReference: {reference}\nRate 1-5, last number counts."
    spec = judge(f"{model_url}/reply-Between 1 and 5 I give 4/v1", template=template, score_format="last_number",
                 min_score=1, max_score=5)  # fmt: skip
    res = await score(request(spec, final_info={"answer": "5"}))
    assert res.status_code == 200, res.text
    assert res.json()["reward"] == pytest.approx(0.75)
    prompt = SEEN[-1]["body"]["messages"][0]["content"]
    assert prompt.startswith("Environment: What is 2 + 3?\n\nAgent: I think it is 4\n\nEnvironment: Try again.")
    assert "Reference: 5" in prompt


async def test_the_api_key_comes_from_the_named_variable(model_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STUB_JUDGE_KEY", KEY)
    ok = await score(request(judge(f"{model_url}/auth/v1", api_key_env="STUB_JUDGE_KEY")))
    assert ok.status_code == 200 and SEEN[-1]["auth"] == f"Bearer {KEY}"
    monkeypatch.setenv("STUB_JUDGE_KEY", "wrong")
    wrong = await score(request(judge(f"{model_url}/auth/v1", api_key_env="STUB_JUDGE_KEY")))
    assert wrong.status_code == 502 and "401" in wrong.json()["message"] and "API key" in wrong.json()["message"]
    monkeypatch.delenv("STUB_JUDGE_KEY")
    unset = await score(request(judge(f"{model_url}/auth/v1", api_key_env="STUB_JUDGE_KEY")))
    assert unset.status_code == 502 and "$STUB_JUDGE_KEY is not set" in unset.json()["message"]


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/status-500/v1", 503, "answered 500"),
        ("/status-503/v1", 503, "answered 503"),
        ("/status-429/v1", 503, "answered 429"),
        ("/slow/v1", 503, "no answer within 0.5 s"),
        ("/status-404/v1", 502, "check the URL and the model name"),
        ("/garbage/v1", 502, "not a JSON object"),
        ("/reply-I cannot grade this./v1", 502, 'has no "Score: N" line'),
        ("/reply-Score: 11/v1", 502, "outside its range [0, 10]"),
    ],
)
async def test_judge_failures_are_5xx_never_a_score(model_url: str, path: str, status: int, says: str) -> None:
    res = await score(request(judge(f"{model_url}{path}", timeout_s=0.5)))
    assert res.status_code == status, res.text
    assert says in res.json()["message"]


async def test_a_judge_that_refuses_connections_is_unavailable_to_the_client() -> None:
    spec = judge(f"http://127.0.0.1:{free_port()}/v1")  # nothing listens there
    async with RewardClient("http://reward", timeout_s=10, transport=httpx.ASGITransport(app=create_app())) as client:
        with pytest.raises(RewardServiceUnavailable) as info:
            await client.score(request(spec))
    assert info.value.retryable and "503" in str(info.value) and "ConnectError" in str(info.value)


async def test_request_faults_are_rejected_not_retried(model_url: str) -> None:
    async with RewardClient("http://reward", timeout_s=10, transport=httpx.ASGITransport(app=create_app())) as client:
        with pytest.raises(RewardRequestRejected) as no_ref:
            await client.score(request(judge(f"{model_url}/v1", template="{response} vs {reference}")))
        with pytest.raises(RewardRequestRejected) as no_spec:
            await client.score(request(None))
        with pytest.raises(RewardRequestRejected) as no_prompt:
            await client.score(request(judge(f"{model_url}/v1"), observations=[]))
    assert no_ref.value.status_code == 422 and "gave no reference answer" in no_ref.value.service_message
    assert no_spec.value.status_code == 422 and "[reward_models.grader]" in no_spec.value.service_message
    assert no_prompt.value.status_code == 422 and "no observations" in no_prompt.value.service_message


async def test_a_local_reward_model_is_called_with_the_task_and_the_last_reply(model_url: str) -> None:
    res = await score(request(LocalModelConfig(url=f"{model_url}/local-0.625"), final_info={"answer": "5"}))
    assert res.status_code == 200, res.text
    assert res.json()["reward"] == 0.625 and res.json()["details"]["model_batch_size"] == 3
    assert SEEN[-1]["path"] == "/local-0.625/score"
    assert SEEN[-1]["body"] == {"prompt": "What is 2 + 3?", "response": "\\boxed{5}", "reference": "5"}
    bad = await score(request(LocalModelConfig(url=f"{model_url}/reply-x")))  # a chat answer, not a LocalScoreResult
    assert bad.status_code == 502 and "answered no LocalScoreResult" in bad.json()["message"]
    down = await score(request(LocalModelConfig(url=f"http://127.0.0.1:{free_port()}")))
    assert down.status_code == 503
