"""A local reward model for real: `python -m trajflow.rewards.models.server` serving the pretrained
SmolLM2-135M-Instruct on CPU as a yes/no verifier, called by concurrent clients (batched: the server reports its batch
sizes), by the real reward service, and by whole trajectories of a dataset task through the stack; with the server
stopped, the trajectory ends `infra_failed`, never completed with a zero.

What is asserted about the scores is that they are the model's: each batched reward equals P(Yes) / (P(Yes) + P(No))
computed here at batch 1 with transformers. Not asserted: that SmolLM2-135M tells right from wrong answers. It does
not (measured while writing this: about chance on easy arithmetic over several rubric wordings), so such an
assertion would test luck, not the code.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import ROOT, free_port, running_stack, wait_healthy
from tests.integration.test_user_env import script
from trajflow.contracts.reward_models import LocalModelConfig, LocalScoreRequest
from trajflow.contracts.scoring import ScoreRequest
from trajflow.contracts.trajectory import TrajectoryStatus
from trajflow.rewards.client import RewardClient
from trajflow.rewards.models.scorer import verifier_text
from trajflow.sandbox.user.submit import package_env

pytestmark = pytest.mark.integration

PAIRS = [
    ("What is 2 + 3?", "5"),
    ("What is 2 + 3?", "9"),
    ("What is 7 * 8?", "56"),
    ("What is 7 * 8?", "13"),
    ("What is 10 - 4?", "6"),
    ("What is the capital of France?", "Berlin"),
]
TOL = 1e-4
"""Batched (left-padded) against batch-1 float32 probabilities."""
DATA = "data:chain_sum"
SHIPPED = ROOT / "examples" / "arithmetic" / "chain_sum.jsonl"


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def start_server(model: Path, log: Path) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "trajflow.rewards.models.server", "--model", str(model), "--port", str(port),
            "--max-batch", "8", "--max-wait-ms", "300"]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", proc)
    try:
        wait_healthy(proc, server.url, 180, "reward-model server", log)
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="module")
def smollm2(cache_dir: Path) -> Path:
    from trajflow.rl.models import ensure_smollm2

    return ensure_smollm2(cache_dir)


@pytest.fixture(scope="module")
def server(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(smollm2, tmp_path_factory.mktemp("rm") / "server.log")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def alone(smollm2: Path):
    """P(Yes) / (P(Yes) + P(No)) of one request at batch 1, computed here with transformers (only the rubric's text
    is taken from the server's code)."""
    tok = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    yes, no = tok.encode("Yes", add_special_tokens=False)[0], tok.encode("No", add_special_tokens=False)[0]

    def p_yes(prompt: str, response: str, reference: str | None = None) -> float:
        ids = tok(verifier_text(tok, LocalScoreRequest(prompt=prompt, response=response, reference=reference)),
                  return_tensors="pt", add_special_tokens=False)  # fmt: skip
        with torch.inference_mode():
            probs = torch.softmax(model(**ids).logits[0, -1].float(), dim=-1)
        return float(probs[yes] / (probs[yes] + probs[no]))

    return p_yes


async def test_concurrent_requests_are_batched_and_score_as_the_model_does_alone(server: Server, alone) -> None:
    async with httpx.AsyncClient(timeout=120) as http:
        before = (await http.get(f"{server.url}/healthz")).json()
        answers = await asyncio.gather(
            *(http.post(f"{server.url}/score", json={"prompt": p, "response": r}) for p, r in PAIRS)
        )
        after = (await http.get(f"{server.url}/healthz")).json()
    results = [a.json() for a in answers]
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert max(r["batch_size"] for r in results) > 1  # they shared forward passes
    assert after["requests"] - before["requests"] == len(PAIRS)
    assert after["batches"] - before["batches"] < len(PAIRS)
    assert any(int(size) > 1 for size in after["batch_sizes"]) and after["mode"] == "yes_no"
    for (prompt, response), result in zip(PAIRS, results, strict=True):
        assert result["mode"] == "yes_no" and 0.0 < result["reward"] < 1.0
        assert result["reward"] == pytest.approx(alone(prompt, response), abs=TOL), (prompt, response)


async def test_scored_through_the_reward_service(server: Server, reward_service: str, alone) -> None:
    spec = LocalModelConfig(url=server.url)
    req = ScoreRequest(
        env_id="data:x", reward_fn="model:rm", reward_model=spec, actions=["\\boxed{56}"],
        observations=["What is 7 * 8?"], final_info={"answer": "56"},
    )  # fmt: skip
    async with RewardClient(reward_service, timeout_s=60) as client:
        result = await client.score(req)
    assert result.reward_fn == "model:rm" and result.details["model_mode"] == "yes_no"
    assert result.reward == pytest.approx(alone("What is 7 * 8?", "\\boxed{56}", "56"), abs=TOL)


@pytest.fixture()
def package(store, cache_dir) -> str:
    return package_env(DATA, str(SHIPPED), store, cache_dir / "images", print)


async def test_a_trajectory_is_scored_by_the_model_and_infra_fails_when_it_is_down(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, package, smollm2, tmp_path, alone
) -> None:
    rows = [json.loads(line) for line in SHIPPED.read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    seed = 4
    row = train[seed % len(train)]
    reply = f"The sum is \\boxed{{{row['answer']}}}"
    own = start_server(smollm2, tmp_path / "server.log")  # its own server: this test stops it
    spec = LocalModelConfig(url=own.url, timeout_s=20)
    engine = script(tiny_model, [reply, reply])
    stack = running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images)
    try:
        async with stack as st:
            fields = {
                "env_id": DATA,
                "env_package": package,
                "max_turns": 1,
                "reward_fn": "model:rm",
                "reward_model": spec,
            }
            scored = await st.run(st.request(seed=seed, **fields))
            own.stop()
            down = await st.run(st.request(seed=seed, **fields))
    finally:
        if own.proc.poll() is None:
            own.stop()
    assert scored.status is TrajectoryStatus.COMPLETED, scored.error
    assert scored.reward == pytest.approx(alone(row["prompt"], reply, str(row["answer"])), abs=TOL)
    assert down.status is TrajectoryStatus.INFRA_FAILED and down.reward is None, down
    assert "503" in (down.error or "") and "local reward model" in (down.error or "")
