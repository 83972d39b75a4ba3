"""The endpoint of an `agent:` env (`trajflow/envs/agent.py`) on 127.0.0.1 (an ephemeral port), served by
`http.server.ThreadingHTTPServer` in a thread, in three dialects: OpenAI's Chat Completions (`POST
/v1/chat/completions`), OpenAI's Responses (`POST /v1/responses`, `agent_responses.py`) and Anthropic's Messages (`POST
/v1/messages`, `agent_messages.py`), the last two translated to a chat body; `GET /v1/models` and `/v1/models/{id}`
(in Anthropic's shape for a caller that sends its headers), and `HEAD /` (a liveness probe).

A request is checked and normalised into the turn's observation (`normalize_request`; the other dialects' have `api`),
posted to the env as an `Exchange`, and its handler thread waits until the env answers it with the model's `Answer`:
for chat a `chat.completion` object, or for `stream: true` an SSE stream of `chat.completion.chunk` objects ending with
`data: [DONE]` (`agent_chat.py`); for Responses a `response`, for Messages a `message`, or their named events, as the
`openai` and `anthropic` clients parse them. A malformed request gets HTTP 400 with the dialect's error body, and the
env hears of it; so does a body over MAX_BODY_BYTES, with HTTP 413 before a byte of it is read.

Limits: stdlib only (it runs beside the runner in the sandbox). Requests are served one at a time in arrival order
(concurrent requests queue); `model` is ignored (echoed back); only n = 1; no logprobs, no legacy completions or
function-calling fields are produced. HTTP/1.0: one request per connection. No authentication: it listens on loopback
inside the sandbox.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

if __package__:
    from trajflow.envs import agent_messages, agent_responses
    from trajflow.envs.agent_chat import STREAM_PIECE, Answer, chunks, completion
else:  # beside the runner in the sandbox image
    import agent_messages
    import agent_responses
    from agent_chat import STREAM_PIECE, Answer, chunks, completion

MODEL_ID = "trajflow-policy"
"""The one model `GET /v1/models` lists; a request may name any model (it is echoed back, never used)."""
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
MAX_BODY_BYTES = 32 * 1024 * 1024
"""The largest request body read (Content-Length); a larger one gets HTTP 413 unread, so a program (or a command it
runs) cannot make the endpoint hold more than this in the sandbox's memory. A 128k-token conversation with its tool
definitions is a few MB of JSON."""
REQUEST_TIMEOUT_S = 60.0
"""Socket timeout of a connection's reads and writes (never of the wait for the model's answer)."""
ROUTES = {"/v1/chat/completions": "chat", "/v1/messages": agent_messages.API, "/v1/responses": agent_responses.API}
"""POST routes and the API each speaks."""
DIALECTS = {
    agent_messages.API: (agent_messages.to_chat, agent_messages.message, agent_messages.events),
    agent_responses.API: (agent_responses.to_chat, agent_responses.response, agent_responses.events),
}
"""The translated APIs: (request -> chat body, answer -> the whole reply, the whole reply -> its stream's events)."""
MESSAGES_ERRORS = {
    400: "invalid_request_error",
    404: "not_found_error",
    413: "request_too_large",
    503: "overloaded_error",
}
"""The Messages API's error type for each status the endpoint answers with."""
Event = tuple[str, Any]
"""What the endpoint posts to its env: ("request", Exchange) or ("malformed", message)."""


class MalformedRequest(ValueError):
    """A chat request that cannot be a turn; its message is the 400's and the env's."""


def _json(body: bytes) -> object:
    try:
        return json.loads(body)
    except ValueError as e:
        raise MalformedRequest(f"the request body is not JSON: {e}") from e


def normalize_request(body: bytes, call: int) -> tuple[dict[str, Any], str, bool]:
    """A chat-completions body -> (the turn's observation, the model named, whether usage is streamed); raises
    MalformedRequest."""
    request = _json(body)
    if not isinstance(request, dict):
        raise MalformedRequest("the request body must be a JSON object")
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise MalformedRequest("'messages' must be a non-empty list of messages")
    for index, message in enumerate(messages):
        _check_message(index, message)
    if request.get("n") not in (None, 1):
        raise MalformedRequest(f"n={request.get('n')!r}: this endpoint answers one choice per request (n=1)")
    tools = request.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise MalformedRequest("'tools' must be a list")
    stop = request.get("stop")
    max_tokens = request.get("max_completion_tokens")
    observation: dict[str, Any] = {
        "messages": messages,
        "tool_choice": request.get("tool_choice"),
        "sampling": {
            "temperature": request.get("temperature"),
            "top_p": request.get("top_p"),
            "max_tokens": max_tokens if max_tokens is not None else request.get("max_tokens"),
            "stop": [stop] if isinstance(stop, str) else stop,
            "seed": request.get("seed"),
        },
        "stream": bool(request.get("stream")),
        "call": call,
    }
    if tools is not None:
        observation["tools"] = tools
    options = request.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    model = request.get("model")
    return observation, model if isinstance(model, str) and model else MODEL_ID, include_usage


def _check_message(index: int, message: object) -> None:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise MalformedRequest(f"messages[{index}] must be an object with a 'role' and a 'content'")
    role = message["role"]
    if role not in ROLES:
        raise MalformedRequest(f"messages[{index}] has the unknown role {role!r}; expected one of {', '.join(ROLES)}")
    content = message.get("content")
    if role == "assistant" and content is None and (message.get("tool_calls") or message.get("function_call")):
        return
    if "content" not in message or not isinstance(content, (str, list)):
        raise MalformedRequest(f"messages[{index}] ({role}) needs a 'content' that is a string or a list of parts")


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def openai_model(name: str) -> dict[str, Any]:
    """A model object as OpenAI's `GET /v1/models` lists it."""
    return {"id": name, "object": "model", "created": 0, "owned_by": "trajflow"}


class Exchange:
    """One chat request waiting for its answer; `reply(None)` refuses it (the env is closing)."""

    def __init__(self, observation: dict[str, Any], model: str, include_usage: bool, api: str = "chat") -> None:
        self.api = api
        self.observation = observation
        self.model = model
        self.include_usage = include_usage
        self.answer: Answer | None = None
        self._done = threading.Event()

    def reply(self, answer: Answer | None) -> None:
        self.answer = answer
        self._done.set()

    def wait(self) -> Answer | None:
        self._done.wait()
        return self.answer


class Endpoint:
    """The HTTP server and its thread; it posts a program's requests to `events` and tracks the open exchanges."""

    def __init__(self, events: queue.Queue[Event]) -> None:
        self.events = events
        self._lock = threading.Lock()
        self._calls = 0
        self._open: list[Exchange] = []
        self._closed = False
        self.server = _Server(("127.0.0.1", 0), self)
        self._thread = threading.Thread(target=self.server.serve_forever, name="agent-http", daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def receive(self, body: bytes, api: str = "chat") -> Exchange | None:
        """A request's exchange, posted to the env (None: the endpoint is closing); raises MalformedRequest, posted
        to the env first. `api`: "chat" (a chat-completions body) or a key of DIALECTS (Messages, Responses)."""
        with self._lock:
            if self._closed:
                return None
            try:
                if api != "chat":
                    body = json.dumps(DIALECTS[api][0](_json(body))).encode()
                observation, model, include_usage = normalize_request(body, self._calls + 1)
            except (MalformedRequest, agent_messages.BadMessages, agent_responses.BadResponses) as e:
                self.events.put(("malformed", f"call {self._calls + 1}: {e}"))
                raise MalformedRequest(str(e)) from e
            if api != "chat":
                observation["api"] = api
            self._calls += 1
            exchange = Exchange(observation, model, include_usage, api)
            self._open.append(exchange)
        self.events.put(("request", exchange))
        return exchange

    def refuse(self, message: str) -> None:
        """A request refused before it was read (its body's size): posted to the env as malformed."""
        with self._lock:
            if not self._closed:
                self.events.put(("malformed", f"call {self._calls + 1}: {message}"))

    def done(self, exchange: Exchange) -> None:
        with self._lock:
            if exchange in self._open:
                self._open.remove(exchange)

    def close(self) -> None:
        """Refuse the open exchanges, stop serving, and join the server's threads."""
        with self._lock:
            self._closed = True
            waiting, self._open = self._open, []
        for exchange in waiting:
            exchange.reply(None)
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()
        self.server.join_requests()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._requests: list[threading.Thread] = []
        self._requests_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """As ThreadingMixIn's, but each request's thread is kept to be joined at close (daemon, so a stuck one
        cannot keep the runner alive)."""
        thread = threading.Thread(
            target=self.process_request_thread, args=(request, client_address), name="agent-http-request", daemon=True
        )
        with self._requests_lock:
            self._requests = [t for t in self._requests if t.is_alive()] + [thread]
        thread.start()

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # the program was killed (or gave up) before its answer was written: nothing to report
        super().handle_error(request, client_address)

    def join_requests(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        with self._requests_lock:
            threads, self._requests = self._requests, []
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0.0))


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the runner's stderr is not the program's log."""

    def do_HEAD(self) -> None:
        """A liveness probe (Claude Code sends `HEAD /` before its first request): 200, no body."""
        self.send_response(200 if self.path.split("?")[0] in ("", "/") else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        """`/v1/models` and `/v1/models/{id}`, in the Messages API's shape for a caller that sends Anthropic's
        headers, else in OpenAI's."""
        anthropic = "anthropic-version" in self.headers or "x-api-key" in self.headers
        if anthropic:
            self.api = agent_messages.API
        path = self.path.split("?")[0].rstrip("/")
        if path == "/v1/models":
            model = agent_messages.model_info(MODEL_ID) if anthropic else openai_model(MODEL_ID)
            page = {"data": [model], "has_more": False, "first_id": MODEL_ID, "last_id": MODEL_ID}
            self._send_json(200, page if anthropic else {"object": "list", "data": [model]})
        elif path.startswith("/v1/models/") and "/" not in path.removeprefix("/v1/models/"):
            name = path.removeprefix("/v1/models/")  # any name is served, as a request may name any model
            self._send_json(200, agent_messages.model_info(name) if anthropic else openai_model(name))
        else:
            self._send_json(404, error_body(f"no route GET {self.path}", "not_found_error"))

    def do_POST(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        api = ROUTES.get(path)
        if api is None:
            if path.startswith("/v1/messages/"):  # count_tokens and batches: the caller estimates instead
                self.api = agent_messages.API
            self._send_json(404, error_body(f"no route POST {self.path}", "not_found_error"))
            return
        self.api = api
        endpoint = self.server.endpoint
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            said = f"a Content-Length of {length}" if length >= 0 else "no valid Content-Length"
            message = f"request body: {said}; the endpoint reads 0 to {MAX_BODY_BYTES} bytes"
            endpoint.refuse(message)
            self.close_connection = True  # the body is never read: the connection cannot carry another request
            self._send_json(413 if length > MAX_BODY_BYTES else 400, error_body(message))
            return
        try:
            exchange = endpoint.receive(self.rfile.read(length), api)
        except MalformedRequest as e:
            self._send_json(400, error_body(str(e)))
            return
        answer = exchange.wait() if exchange is not None else None
        if exchange is not None:
            endpoint.done(exchange)
        if exchange is None or answer is None:
            self._send_json(503, error_body("the environment is closing", "service_unavailable"))
            return
        if api != "chat":
            _, render, events = DIALECTS[api]
            fields = (answer.content, answer.tool_calls, answer.finish_reason, answer.usage, exchange.model)
            whole = render(*fields, exchange.observation["call"])
            if exchange.observation["stream"]:
                self._send_events(events(whole, STREAM_PIECE))
            else:
                self._send_json(200, whole)
            return
        call_id, created = f"chatcmpl-trajflow-{exchange.observation['call']}", int(time.time())
        if exchange.observation["stream"]:
            self._send_stream(chunks(answer, exchange.model, call_id, created, exchange.include_usage))
        else:
            self._send_json(200, completion(answer, exchange.model, call_id, created))

    def _send_json(self, status: int, body: dict[str, Any]) -> None:
        if getattr(self, "api", "chat") == agent_messages.API and status != 200:
            body = agent_messages.error_body(body["error"]["message"], MESSAGES_ERRORS.get(status, "api_error"))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_events(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        """Named server-sent events (the Messages API's stream)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        for name, data in events:
            self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def _send_stream(self, events: list[dict[str, Any]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        for event in events:
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


ANSWER_KEYS = {"content", "tool_calls", "finish_reason", "usage"}
FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter")


class BadAction(ValueError):
    """An action that cannot be an answer; the request stays pending."""


def parse_action(action: str) -> Answer:
    """A step's action -> the answer sent to the program (see the module docstring); raises BadAction."""
    try:
        parsed = json.loads(action)
    except ValueError:
        parsed = None
    if not (isinstance(parsed, dict) and parsed.keys() <= ANSWER_KEYS and parsed.keys() & {"content", "tool_calls"}):
        return Answer(content=action)
    content = parsed.get("content")
    if content is not None and not isinstance(content, str):
        raise BadAction("an action's 'content' must be a string or null")
    calls = parsed.get("tool_calls") or []
    if not isinstance(calls, list):
        raise BadAction("an action's 'tool_calls' must be a list")
    tool_calls = [_tool_call(index, call) for index, call in enumerate(calls)]
    finish = parsed.get("finish_reason") or ("tool_calls" if tool_calls else "stop")
    if finish not in FINISH_REASONS:
        raise BadAction(f"finish_reason {finish!r} is not one of {', '.join(FINISH_REASONS)}")
    usage = parsed.get("usage") or {}
    if not isinstance(usage, dict):
        raise BadAction("an action's 'usage' must be an object")
    return Answer(content=content, tool_calls=tool_calls, finish_reason=finish, usage=usage)


def _tool_call(index: int, call: object) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(call, dict) or not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise BadAction(f"tool_calls[{index}] must be {{'function': {{'name': str, 'arguments': str|object}}}}")
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    call_id = call.get("id") if isinstance(call.get("id"), str) else f"call_{index}"
    return {"id": call_id, "type": "function", "function": {"name": function["name"], "arguments": arguments}}
