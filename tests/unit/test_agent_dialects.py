"""The agent endpoint's dialects with the official clients as the callers (`openai`, `anthropic`), against the real
server on loopback (`trajflow.envs.agent_http.Endpoint`) whose answers a script gives: each request's observation (what
the turn records and the decode side reads) and each answer as the client parses it, streamed and not, with system
prompts, tools, tool calls and tool results, and the 400s in each dialect's error shape."""

from __future__ import annotations

import json
import queue
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from trajflow.envs.agent_http import Answer, Endpoint, Event, Exchange
from trajflow.envs.agent_messages import API

READ: Any = {"name": "read", "description": "Read a file.", "input_schema": {"type": "object", "properties": {}}}
CALL = {"id": "call_1_0", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.txt"}'}}

USAGE = {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}


class Scripted:
    """An endpoint whose requests are answered, in order, by `answers`; `seen` holds each request's observation and
    `malformed` what the env heard of refused ones."""

    def __init__(self, answers: list[Answer]) -> None:
        self.events: queue.Queue[Event] = queue.Queue()
        self.endpoint = Endpoint(self.events)
        self.answers = list(answers)
        self.seen: list[dict[str, Any]] = []
        self.malformed: list[str] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            kind, payload = self.events.get()
            if kind == "stop":
                return
            if kind == "malformed":
                self.malformed.append(payload)
                continue
            assert isinstance(payload, Exchange)
            self.seen.append(payload.observation)
            payload.reply(self.answers.pop(0))

    def heard(self) -> list[str]:
        """What the env heard of refused requests: the endpoint posts it before its 400, and this script's thread
        takes it from the queue in its own time, so wait (up to 10 s) for it."""
        deadline = time.monotonic() + 10
        while not self.malformed and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.malformed

    def close(self) -> None:
        self.events.put(("stop", None))
        self._thread.join(10)
        self.endpoint.close()


@pytest.fixture()
def scripted() -> Iterator[Any]:
    made: list[Scripted] = []

    def make(*answers: Answer) -> Scripted:
        made.append(Scripted(list(answers)))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _anthropic(s: Scripted) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=s.endpoint.base_url.removesuffix("/v1"), api_key="x", max_retries=0)


def _openai(s: Scripted) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.endpoint.base_url, api_key="x", max_retries=0)


def test_messages_text_with_a_system_prompt(scripted) -> None:
    s = scripted(Answer("four", usage=USAGE))
    reply = _anthropic(s).messages.create(
        model="claude-x",
        max_tokens=64,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": "2+2?"}],
        stop_sequences=["END"],
    )
    assert reply.type == "message" and reply.role == "assistant" and reply.model == "claude-x"
    assert [(b.type, getattr(b, "text", None)) for b in reply.content] == [("text", "four")]
    assert reply.stop_reason == "end_turn" and (reply.usage.input_tokens, reply.usage.output_tokens) == (11, 4)
    [seen] = s.seen
    assert seen["api"] == API and seen["stream"] is False and seen["call"] == 1
    assert seen["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert seen["sampling"]["max_tokens"] == 64
    assert seen["sampling"]["stop"] == ["END"]


def test_messages_tool_use_round_trip_keeps_the_recorded_arguments(scripted) -> None:
    """The answer's tool call is a tool_use block; the client sends it back with the tool's result, and the next
    observation holds the assistant's call with the very arguments the model wrote and the result as a tool message."""
    s = scripted(Answer(None, [CALL], "tool_calls", USAGE), Answer("it says hi", usage=USAGE))
    client = _anthropic(s)
    asked: Any = [{"role": "user", "content": "what is in a.txt?"}]
    first = client.messages.create(model="m", max_tokens=32, tools=[READ], tool_choice={"type": "auto"}, messages=asked)
    [use] = first.content
    assert first.stop_reason == "tool_use" and use.type == "tool_use"
    assert (use.id, use.name, use.input) == ("call_1_0", "read", {"path": "a.txt"})
    result = {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "hi"}]}
    followed = [*asked, {"role": "assistant", "content": first.content}, {"role": "user", "content": [result]}]
    second = client.messages.create(model="m", max_tokens=32, tools=[READ], messages=followed)
    assert second.content[0].type == "text" and second.content[0].text == "it says hi"
    tool = {"type": "function", "function": {**{k: READ[k] for k in ("name", "description")}, "parameters": {}}}
    tool["function"]["parameters"] = READ["input_schema"]
    assert s.seen[0]["tools"] == [tool] and s.seen[0]["tool_choice"] == "auto"
    assert s.seen[1]["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1_0", "content": "hi"},
    ]


def test_messages_streamed_text_and_tool_use_reassemble(scripted) -> None:
    long = "a streamed answer longer than one piece of sixteen characters"
    s = scripted(Answer(long, usage=USAGE), Answer("", [CALL], "tool_calls", USAGE))
    client = _anthropic(s)
    with client.messages.stream(model="m", max_tokens=99, messages=[{"role": "user", "content": "go"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == long and final.content[0].type == "text" and final.content[0].text == long
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 4
    with client.messages.stream(
        model="m", max_tokens=9, tools=[READ], messages=[{"role": "user", "content": "x"}]
    ) as st:
        called = st.get_final_message()
    assert [(b.type, getattr(b, "input", None)) for b in called.content] == [("tool_use", {"path": "a.txt"})]
    assert called.stop_reason == "tool_use" and all(seen["stream"] for seen in s.seen)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "a image block is not supported",
        ),
        ({"max_tokens": 5, "messages": []}, "messages: must be a non-empty list"),
    ],
    ids=["no-max-tokens", "an-image", "no-messages"],
)
def test_messages_refusals_are_400s_in_anthropics_shape(scripted, body: dict, says: str) -> None:
    s = scripted()
    with pytest.raises(anthropic.BadRequestError) as caught:
        _anthropic(s).post("/v1/messages", body=body, cast_to=object)
    assert caught.value.status_code == 400
    error = caught.value.body
    assert isinstance(error, dict) and error["type"] == "error", error
    assert error["error"]["type"] == "invalid_request_error" and says in error["error"]["message"], error
    assert len(s.heard()) == 1 and says in s.malformed[0]


def test_models_in_each_clients_shape_a_liveness_probe_and_no_token_counting(scripted) -> None:
    """`GET /v1/models` (and one model) as each official client parses it, `HEAD /` as Claude Code probes it, and
    `POST /v1/messages/count_tokens` a 404 in the Messages shape (the sandbox has no tokenizer: callers estimate)."""
    s = scripted()
    listed = _anthropic(s).models.list()
    assert [(m.type, m.id, m.display_name) for m in listed.data] == [("model", "trajflow-policy", "trajflow-policy")]
    assert listed.has_more is False and listed.first_id == listed.last_id == "trajflow-policy"
    assert _anthropic(s).models.retrieve("claude-x").id == "claude-x"
    assert [m.id for m in _openai(s).models.list()] == ["trajflow-policy"]
    assert _openai(s).models.retrieve("gpt-x").owned_by == "trajflow"
    base = s.endpoint.base_url.removesuffix("/v1")
    with urllib.request.urlopen(urllib.request.Request(base + "/", method="HEAD"), timeout=10) as probe:
        assert probe.status == 200 and probe.read() == b""
    with pytest.raises(anthropic.NotFoundError) as caught:
        _anthropic(s).messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
    body: Any = caught.value.body
    assert (
        body["type"] == "error"
        and body["error"]["type"] == "not_found_error"
        and "count_tokens" in body["error"]["message"]
    )
    assert s.seen == [] and s.malformed == []


def test_chat_completions_with_the_openai_client(scripted) -> None:
    """The chat dialect as the `openai` client speaks it: models, a tool call, a streamed answer, a 400."""
    s = scripted(Answer(None, [CALL], "tool_calls", USAGE), Answer("streamed text of the final answer", usage=USAGE))
    client = _openai(s)
    assert [m.id for m in client.models.list()] == ["trajflow-policy"]
    tools: Any = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
    asked: Any = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "what is in a.txt?"}]
    first = client.chat.completions.create(model="m", messages=asked, tools=tools)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls is not None
    [call] = choice.message.tool_calls
    assert call.type == "function" and (call.id, call.function.name, call.function.arguments) == (
        "call_1_0",
        "read",
        '{"path": "a.txt"}',
    )
    assert first.usage is not None and first.usage.total_tokens == 15
    followed: Any = [
        *asked,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "hi"},
    ]
    stream = client.chat.completions.create(
        model="m", messages=followed, tools=tools, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "streamed text of the final answer" and chunks[-1].usage is not None
    assert "api" not in s.seen[0] and s.seen[1]["messages"][2]["tool_calls"] == [CALL]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", messages=[])
    assert caught.value.status_code == 400 and json.dumps(caught.value.body).count("invalid_request_error") == 1


def test_responses_text_tool_call_and_round_trip_with_the_openai_client(scripted) -> None:
    """The Responses dialect (the Codex CLI's): instructions and input items in, a function_call item out; sent back
    as input with its output, it is the assistant turn as recorded, followed by the tool message."""
    s = scripted(Answer("Let me look.", [CALL], "tool_calls", USAGE), Answer("it says hi", usage=USAGE))
    client = _openai(s)
    tool: Any = {"type": "function", "name": "read", "description": "Read a file.", "parameters": {"type": "object"}}
    first = client.responses.create(
        model="m", instructions="Be brief.", input="what is in a.txt?", tools=[tool], max_output_tokens=40
    )
    assert first.status == "completed" and [item.type for item in first.output] == ["message", "function_call"]
    assert first.output_text == "Let me look."
    call = first.output[1]
    assert call.type == "function_call" and (call.call_id, call.name, call.arguments) == (
        "call_1_0",
        "read",
        '{"path": "a.txt"}',
    )
    assert first.usage is not None and (first.usage.input_tokens, first.usage.output_tokens) == (11, 4)
    sent_back: Any = [
        {"role": "user", "content": "what is in a.txt?"},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "hi"},
    ]
    second = client.responses.create(model="m", instructions="Be brief.", input=sent_back, tools=[tool])
    assert second.output_text == "it says hi"
    assert s.seen[0]["api"] == "openai.responses" and s.seen[0]["sampling"]["max_tokens"] == 40
    assert s.seen[0]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "what is in a.txt?"},
    ]
    assert s.seen[0]["tools"] == [
        {
            "type": "function",
            "function": {"name": "read", "parameters": {"type": "object"}, "description": "Read a file."},
        }
    ]
    assert s.seen[1]["messages"][2:] == [
        {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1_0", "content": "hi"},
    ]


def test_responses_stream_reassembles_text_and_arguments(scripted) -> None:
    long = "a streamed answer longer than one piece of sixteen characters"
    s = scripted(Answer(long, [CALL], "tool_calls", USAGE), Answer("cut", finish_reason="length", usage=USAGE))
    client = _openai(s)
    with client.responses.stream(model="m", input=[{"role": "user", "content": "go"}]) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == long and final.output_text == long and final.status == "completed"
    fc = final.output[1]
    assert fc.type == "function_call" and fc.arguments == '{"path": "a.txt"}'
    events = list(client.responses.create(model="m", input="more", stream=True))
    assert events[-1].type == "response.incomplete" and [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.incomplete_details is not None
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id is not supported"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "only function tools"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "only text parts"),
    ],
    ids=["stored-state", "a-hosted-tool", "an-image"],
)
def test_responses_refusals_are_400s_in_openais_shape(scripted, body: dict, says: str) -> None:
    s = scripted()
    with pytest.raises(openai.BadRequestError) as caught:
        _openai(s).post("/responses", body={"model": "m", **body}, cast_to=object)
    error = caught.value.body
    assert caught.value.status_code == 400 and isinstance(error, dict), error
    assert error["type"] == "invalid_request_error" and says in error["message"], error
    assert len(s.heard()) == 1 and says in s.malformed[0]
