"""The agent endpoint's request-size limit (`trajflow.envs.agent_http`, the real server on loopback): a body whose
Content-Length is over `MAX_BODY_BYTES` gets HTTP 413 without a byte of it read, so a program, or a command the
model makes it run, cannot make the endpoint allocate it in the sandbox; a missing or invalid length gets 400. The
env hears of both as a malformed request."""

from __future__ import annotations

import json
import queue
import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest

from trajflow.envs.agent_http import MAX_BODY_BYTES, Answer, Endpoint, Event


@pytest.fixture()
def endpoint() -> Iterator[tuple[Endpoint, queue.Queue[Event]]]:
    events: queue.Queue[Event] = queue.Queue()
    served = Endpoint(events)
    try:
        yield served, events
    finally:
        served.close()


def _post(endpoint: Endpoint, length_header: str) -> tuple[int, dict]:
    """POST the chat route with this Content-Length header line and no body; the status and the JSON answer."""
    port = endpoint.server.server_address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + length_header.encode()
            + b"\r\n"
        )
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_a_body_over_the_limit_gets_413_unread_and_the_env_hears_of_it(endpoint) -> None:
    served, events = endpoint
    status, body = _post(served, f"Content-Length: {10 * 1024**3}\r\n")  # 10 GiB announced, none sent
    assert status == 413, body
    assert body["error"]["type"] == "invalid_request_error" and str(MAX_BODY_BYTES) in body["error"]["message"]
    kind, message = events.get(timeout=5)
    assert kind == "malformed" and message.startswith("call 1:") and str(10 * 1024**3) in message


@pytest.mark.parametrize("header", ["Content-Length: -5\r\n", "Content-Length: lots\r\n"], ids=["negative", "text"])
def test_an_invalid_length_gets_400(endpoint, header: str) -> None:
    served, events = endpoint
    status, body = _post(served, header)
    assert status == 400 and "no valid Content-Length" in body["error"]["message"], body
    assert events.get(timeout=5)[0] == "malformed"


def test_a_long_conversation_under_the_limit_is_served(endpoint) -> None:
    """A 4 MB request (about a million tokens of text) is read whole and answered as usual."""
    served, events = endpoint
    long = "x" * (4 * 1024 * 1024)
    request = json.dumps({"model": "m", "messages": [{"role": "user", "content": long}]}).encode()
    assert len(request) < MAX_BODY_BYTES
    answered: list[dict] = []

    def answer() -> None:
        kind, exchange = events.get(timeout=30)
        assert kind == "request" and exchange.observation["messages"][0]["content"] == long
        exchange.reply(Answer("done"))

    thread = threading.Thread(target=answer)
    thread.start()
    call = urllib.request.Request(
        served.base_url + "/chat/completions", data=request, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(call, timeout=60) as response:
        answered.append(json.loads(response.read()))
    thread.join(30)
    assert answered[0]["choices"][0]["message"]["content"] == "done"
