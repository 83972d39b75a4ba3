"""The real reward service as a subprocess, driven by RewardClient; plus a dead port, a silent socket and a
garbage-answering HTTP server, to check that each failure is classified and the timeout is honoured."""

from __future__ import annotations

import asyncio
import http.server
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.unit.test_rewards_registry import BUILTINS
from trajflow.contracts.scoring import ScoreRequest
from trajflow.rewards.client import (
    RewardClient,
    RewardRequestRejected,
    RewardServiceBadAnswer,
    RewardServiceUnavailable,
    RewardVerifierTimedOut,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
VERIFIER_LIMIT_S = 2.0
REQ = ScoreRequest(env_id="game:GuessTheNumber-v0-easy", seed=3, actions=["\\boxed{5}"], env_rewards=[0.0, 1.0])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, log_path: Path, deadline_s: float = 30.0) -> None:
    """Poll /healthz until it answers ok, the process dies, or the deadline passes."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            out = log_path.read_text(errors="replace")[-2000:]
            pytest.fail(f"reward service exited with {proc.returncode} before ready:\n{out}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).json() == {"ok": True}:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    pytest.fail(f"reward service at {url} not ready within {deadline_s} s")


@pytest.fixture(scope="module")
def service_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "trajflow.rewards.service", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--log-level", "warning", "--verifier-timeout-s", str(VERIFIER_LIMIT_S), "--verifier-processes", "2"]
    log_path = tmp_path_factory.mktemp("reward") / "service.log"  # a file, not a pipe: it never fills up
    log = log_path.open("wb")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, url, log_path)
        yield url
    finally:
        proc.terminate()  # by PID; uvicorn shuts down gracefully on SIGTERM
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


class _Scripted(http.server.BaseHTTPRequestHandler):
    """Answers every POST with the server's scripted status and body."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        status, body = self.server.answer  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
        pass


@pytest.fixture
def scripted_server() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    server.answer = (200, b"")  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.asyncio
async def test_scores_an_episode(service_url: str) -> None:
    async with RewardClient(service_url) as client:
        result = await client.score(REQ)
        assert (result.reward, result.reward_fn) == (1.0, "env_outcome")
        assert result.details["turns"] == 1
        success = await client.score(REQ.model_copy(update={"reward_fn": "success"}))
        assert success.reward == 1.0
        assert await client.reward_fns() == BUILTINS


@pytest.mark.asyncio
async def test_concurrent_requests(service_url: str) -> None:
    reqs = [REQ.model_copy(update={"env_rewards": [float(i)]}) for i in range(32)]
    async with RewardClient(service_url) as client:
        results = await asyncio.gather(*(client.score(r) for r in reqs))
    assert [r.reward for r in results] == [float(i) for i in range(32)]


@pytest.mark.asyncio
async def test_unknown_fn_is_rejected(service_url: str) -> None:
    async with RewardClient(service_url) as client:
        with pytest.raises(RewardRequestRejected) as info:
            await client.score(REQ.model_copy(update={"reward_fn": "no_such_fn"}))
    assert info.value.status_code == 404
    assert "no_such_fn" in str(info.value) and "env_outcome" in str(info.value)
    assert not info.value.retryable


def test_extra_fields_are_rejected_over_http(service_url: str) -> None:
    response = httpx.post(f"{service_url}/score", json={"env_id": "x", "bogus": 1}, timeout=5.0)
    assert response.status_code == 422
    assert "body.bogus" in response.json()["message"]


@pytest.mark.asyncio
async def test_dead_port_is_unavailable_quickly() -> None:
    client = RewardClient(f"http://127.0.0.1:{_free_port()}", timeout_s=2.0)
    start = time.monotonic()
    with pytest.raises(RewardServiceUnavailable) as info:
        await client.score(REQ)
    assert time.monotonic() - start < 2.0
    assert info.value.retryable
    await client.close()


@pytest.mark.asyncio
async def test_silent_server_is_unavailable_after_the_timeout() -> None:
    """A socket that accepts connections (kernel backlog) but never answers: the deadline must hold."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        client = RewardClient(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.5)
        start = time.monotonic()
        with pytest.raises(RewardServiceUnavailable):
            await client.score(REQ)
        elapsed = time.monotonic() - start
        await client.close()
    assert 0.4 <= elapsed < 2.0


@pytest.mark.asyncio
async def test_garbage_answer_is_a_bad_answer(scripted_server: http.server.ThreadingHTTPServer) -> None:
    scripted_server.answer = (200, b"hello, I am not JSON " * 20)  # type: ignore[attr-defined]
    async with RewardClient(f"http://127.0.0.1:{scripted_server.server_address[1]}") as client:
        with pytest.raises(RewardServiceBadAnswer) as info:
            await client.score(REQ)
    assert "hello, I am not JSON" in str(info.value)
    assert not info.value.retryable


@pytest.mark.asyncio
async def test_503_from_a_server_is_unavailable(scripted_server: http.server.ThreadingHTTPServer) -> None:
    scripted_server.answer = (503, b"scaling up")  # type: ignore[attr-defined]
    async with RewardClient(f"http://127.0.0.1:{scripted_server.server_address[1]}") as client:
        with pytest.raises(RewardServiceUnavailable, match="scaling up"):
            await client.score(REQ)


def _math(answer: str) -> ScoreRequest:
    reply = f"The answer is \\boxed{{{answer}}}"
    return ScoreRequest(env_id="data:x", reward_fn="math_verify", actions=[reply], final_info={"answer": "1/2"})


@pytest.mark.asyncio
async def test_a_pathological_math_answer_times_out_typed_and_the_service_goes_on(service_url: str) -> None:
    """`9**9**9**9` makes sympy compute a power with ~10**8 digits and then a far larger one: without a limit it pins
    a thread and a core for good. Here it ends as a typed timeout (never a score), while normal answers sent at the same
    time and after it are scored as usual."""
    async with RewardClient(service_url, timeout_s=30.0) as client:
        assert (await client.score(_math("0.5"))).reward == 1.0  # warm: the worker processes exist
        start = time.monotonic()
        crafted = asyncio.ensure_future(client.score(_math("9**9**9**9")))
        meanwhile = [await client.score(_math(a)) for a in ("\\frac{1}{2}", "0.25", "1/2")]
        with pytest.raises(RewardVerifierTimedOut) as info:
            await crafted
        elapsed = time.monotonic() - start
        after = await client.score(_math("0.5"))
    assert [r.reward for r in meanwhile] == [1.0, 0.0, 1.0] and after.reward == 1.0
    err = info.value
    assert (err.reward_fn, err.timeout_s, err.status_code, err.retryable) == (
        "math_verify",
        VERIFIER_LIMIT_S,
        422,
        False,
    )
    assert f"verifier 'math_verify' timed out after {VERIFIER_LIMIT_S:g} s" in str(err)
    assert VERIFIER_LIMIT_S <= elapsed < VERIFIER_LIMIT_S + 15.0  # the limit, plus generous slack for a busy machine
