"""The reward service app in-process (fastapi TestClient): 200, 404, 422, 500 bodies and the CLI defaults."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from tests.unit.test_rewards_registry import BUILTINS
from trajflow.contracts.scoring import ScoreRequest, ScoreResult
from trajflow.rewards import registry
from trajflow.rewards.service import _parse_args, create_app


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(create_app()) as c:
        yield c


def test_score_returns_a_score_result(client: TestClient) -> None:
    body = {"env_id": "game:X", "actions": ["a", "b"], "env_rewards": [0.0, 1.0], "terminated": True}
    response = client.post("/score", json=body)
    assert response.status_code == 200
    result = ScoreResult.model_validate(response.json())
    assert result.reward == 1.0
    assert result.reward_fn == "env_outcome"  # the default
    assert result.details["turns"] == 2


def test_score_accepts_what_the_contract_serialises(client: TestClient) -> None:
    req = ScoreRequest(reward_fn="success", env_id="game:X", env_rewards=[0.0, 1.0])
    response = client.post("/score", content=req.model_dump_json(), headers={"content-type": "application/json"})
    assert response.status_code == 200
    assert response.json()["reward"] == 1.0


def test_unknown_reward_fn_is_404_naming_the_known_ones(client: TestClient) -> None:
    response = client.post("/score", json={"env_id": "game:X", "reward_fn": "nope"})
    assert response.status_code == 404
    body = response.json()
    assert "'nope'" in body["message"]
    assert body["known"] == BUILTINS


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"env_id": "game:X", "seed": "abc"}, "body.seed"),
        ({"env_id": "game:X", "env_rewards": ["x"]}, "body.env_rewards.0"),
        ({"seed": 1}, "body.env_id"),
        ({"env_id": "game:X", "surprise": 1}, "body.surprise"),
    ],
)
def test_wrong_fields_are_422_naming_the_field(client: TestClient, body: dict[str, object], field: str) -> None:
    response = client.post("/score", json=body)
    assert response.status_code == 422
    assert field in response.json()["message"]


def test_extra_fields_are_rejected(client: TestClient) -> None:
    response = client.post("/score", json={"env_id": "game:X", "reward": 5.0})
    assert response.status_code == 422
    assert "Extra inputs are not permitted" in response.json()["message"]


def test_body_that_is_not_json_is_422(client: TestClient) -> None:
    response = client.post("/score", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert "not valid JSON" in response.json()["message"]


def test_non_finite_env_reward_is_422(client: TestClient) -> None:
    raw = b'{"env_id": "game:X", "env_rewards": [0.0, NaN]}'
    response = client.post("/score", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert "body.env_rewards.1" in response.json()["message"]


def _raises(req: ScoreRequest) -> ScoreResult:
    raise ZeroDivisionError("boom")


def _loops(req: ScoreRequest) -> ScoreResult:
    while True:
        pass


@pytest.mark.parametrize("bounded", [True, False])
def test_a_failing_reward_fn_is_500_with_its_error(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, bounded: bool
) -> None:
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register("raises", bounded=bounded)(_raises)  # in a worker process, or in the service's thread
    response = client.post("/score", json={"env_id": "game:X", "reward_fn": "raises"})
    assert response.status_code == 500
    assert "reward function 'raises' failed: ZeroDivisionError: boom" in response.json()["message"]


def test_a_verifier_past_the_limit_is_422_verifier_timed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register("loops")(_loops)
    with TestClient(create_app(verifier_timeout_s=0.5, verifier_processes=1)) as client:
        response = client.post("/score", json={"env_id": "game:X", "reward_fn": "loops"})
        assert response.status_code == 422
        body = response.json()
        assert (body["error"], body["reward_fn"], body["timeout_s"]) == ("VerifierTimedOut", "loops", 0.5)
        assert "verifier 'loops' timed out after 0.5 s" in body["message"]
        right = {
            "env_id": "data:x",
            "reward_fn": "math_verify",
            "actions": ["\\boxed{0.5}"],
            "final_info": {"answer": "1/2"},
        }
        assert client.post("/score", json=right).json()["reward"] == 1.0  # the next call gets a fresh worker


def test_healthz_and_reward_fns(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"ok": True}
    assert client.get("/reward-fns").json() == BUILTINS


def test_host_and_port_default_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOST", "0.0.0.0")
    monkeypatch.setenv("PORT", "9123")
    args = _parse_args([])
    assert (args.host, args.port) == ("0.0.0.0", 9123)
    args = _parse_args(["--host", "127.0.0.1", "--port", "7000"])
    assert (args.host, args.port) == ("127.0.0.1", 7000)
    monkeypatch.delenv("HOST")
    monkeypatch.delenv("PORT")
    args = _parse_args([])
    assert (args.host, args.port) == ("127.0.0.1", 8080)


def test_the_verifier_limit_comes_from_the_flag_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAJFLOW_VERIFIER_TIMEOUT_S", raising=False)
    assert _parse_args([]).verifier_timeout_s == 5.0
    monkeypatch.setenv("TRAJFLOW_VERIFIER_TIMEOUT_S", "2")
    assert _parse_args([]).verifier_timeout_s == 2.0
    assert _parse_args(["--verifier-timeout-s", "0.25"]).verifier_timeout_s == 0.25
    for argv in (["--verifier-timeout-s", "0"], ["--verifier-processes", "0"]):
        with pytest.raises(SystemExit) as info:
            _parse_args(argv)
        assert info.value.code == 2
