"""Anthropic's Messages API on the agent endpoint (`POST /v1/messages`, `agent_http.py`): a request is translated into
the chat-completions body that the endpoint checks and records (`to_chat`), and the model's answer is rendered as a
Messages `message` (`message`), or for `stream: true` as its server-sent events (`events`), as the `anthropic` client
parses them. Programs get ANTHROPIC_BASE_URL (the endpoint, without /v1) and a dummy ANTHROPIC_API_KEY.

Translation: `system` (a string or text blocks) -> a system message; a user turn's `tool_result` blocks -> `tool`
messages (their text) before its text blocks -> one user message; an assistant turn's text blocks -> its content and
its `tool_use` blocks -> `tool_calls`, their `input` as JSON text (`json.dumps(input, ensure_ascii=False)`, which is
how the answer's arguments were recorded when the model wrote an object); `tools` (`input_schema`) -> function tools;
`tool_choice` auto / any / tool / none -> "auto" / "required" / that function / "none"; `max_tokens`,
`stop_sequences`, `temperature`, `top_p`. The answer's finish reason `stop` is `end_turn` (a stop sequence is not told
apart), `length` is `max_tokens`, `tool_calls` is `tool_use`.

Ignored: `cache_control` on blocks, `metadata`, `top_k`, `thinking` (no thinking blocks are produced), `service_tier`.
Refused with HTTP 400 in Anthropic's error shape: image and document blocks, and anything malformed. Limits: stdlib
only (it runs beside the runner in the sandbox).
"""

from __future__ import annotations

import json
from typing import Any

API = "anthropic.messages"
"""The observation's `api` for a Messages request (a chat-completions request's observation has no `api`)."""
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}


class BadMessages(ValueError):
    """A Messages request that cannot be translated (the endpoint answers 400)."""


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def model_info(name: str) -> dict[str, Any]:
    """A model object as the Messages API's `GET /v1/models` lists it."""
    return {"type": "model", "id": name, "display_name": name, "created_at": "1970-01-01T00:00:00Z"}


def to_chat(request: object) -> dict[str, Any]:
    """A Messages request body (parsed JSON) -> the chat-completions body it means; raises BadMessages."""
    if not isinstance(request, dict):
        raise BadMessages("the request body must be a JSON object")
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadMessages("messages: must be a non-empty list")
    max_tokens = request.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadMessages(f"max_tokens: a positive integer is required, got {max_tokens!r}")
    chat: list[dict[str, Any]] = []
    system = request.get("system")
    if system is not None:
        chat.append({"role": "system", "content": _text(system, "system")})
    for index, message in enumerate(messages):
        chat += _messages(index, message)
    body: dict[str, Any] = {"messages": chat, "max_tokens": max_tokens, "stream": bool(request.get("stream"))}
    for theirs, ours in (("temperature", "temperature"), ("top_p", "top_p"), ("stop_sequences", "stop")):
        if request.get(theirs) is not None:
            body[ours] = request[theirs]
    if isinstance(request.get("model"), str):
        body["model"] = request["model"]
    tools = request.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise BadMessages("tools: must be a list")
        body["tools"] = [_tool(i, tool) for i, tool in enumerate(tools)]
    if request.get("tool_choice") is not None:
        body["tool_choice"] = _tool_choice(request["tool_choice"])
    return body


def _text(content: object, where: str) -> str:
    """A string, or the text of a list of text blocks (joined), as one string."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadMessages(f"{where}: must be a string or a list of content blocks")
    parts = []
    for i, block in enumerate(content):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise BadMessages(f"{where}.{i}: only text blocks are supported here, got {kind!r}")
        parts.append(block["text"])
    return "".join(parts)


def _messages(index: int, message: object) -> list[dict[str, Any]]:
    """One Messages turn as chat messages: a user turn's tool results first, then its text; an assistant turn as one
    message with its tool calls."""
    where = f"messages.{index}"
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise BadMessages(f"{where}: must be an object whose role is 'user' or 'assistant'")
    role, content = message["role"], message.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    if not isinstance(blocks, list):
        raise BadMessages(f"{where}.content: must be a string or a list of content blocks")
    texts: list[str] = []
    results: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_result" and role == "user" and isinstance(block.get("tool_use_id"), str):
            result = block.get("content", "")
            text = _text(result, f"{where}.content.{i}.content")
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        elif kind == "tool_use" and role == "assistant" and isinstance(block.get("name"), str):
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            function = {"name": block["name"], "arguments": arguments}
            calls.append({"id": str(block.get("id", "")), "type": "function", "function": function})
        elif kind == "thinking" and role == "assistant":
            continue  # never produced here; a harness may echo one back
        else:
            raise BadMessages(f"{where}.content.{i}: a {kind or 'malformed'} block is not supported in a {role} turn")
    if role == "assistant":
        return [{"role": "assistant", "content": "".join(texts) or None, **({"tool_calls": calls} if calls else {})}]
    return results + ([{"role": "user", "content": "".join(texts)}] if texts or not results else [])


def _tool(index: int, tool: object) -> dict[str, Any]:
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        raise BadMessages(f"tools.{index}: must be an object with a name and an input_schema")
    if tool.get("type") not in (None, "custom"):
        raise BadMessages(f"tools.{index}: server tools ({tool['type']}) are not supported; define a custom tool")
    function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: object) -> object:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(choice, dict) and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise BadMessages(f"tool_choice: expected auto, any, tool (with a name) or none, got {choice!r:.200}")


def message(
    content: str | None, tool_calls: list[dict[str, Any]], finish: str, usage: dict[str, Any], model: str, call: int
) -> dict[str, Any]:
    """The answer as a Messages `message` object."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
    for tool_call in tool_calls:
        function = tool_call["function"]
        blocks.append({"type": "tool_use", "id": tool_call["id"], "name": function["name"], "input": _input(function)})
    return {
        "id": f"msg_trajflow_{call}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": STOP_REASONS.get(finish, "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0)},
    }


def _input(function: dict[str, Any]) -> dict[str, Any]:
    """A tool call's arguments as the `input` object (arguments that are not a JSON object: {"arguments": text})."""
    try:
        value = json.loads(function.get("arguments") or "{}")
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"arguments": function.get("arguments")}


def events(whole: dict[str, Any], piece: int) -> list[tuple[str, dict[str, Any]]]:
    """The (event, data) pairs that stream the `message` `whole`, text and tool inputs in pieces of `piece`
    characters."""
    start = {**whole, "content": [], "stop_reason": None, "usage": {**whole["usage"], "output_tokens": 0}}
    out: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(whole["content"]):
        if block["type"] == "text":
            opened, text, delta = {"type": "text", "text": ""}, block["text"], "text_delta"
        else:
            opened = {**block, "input": {}}
            text, delta = json.dumps(block["input"], ensure_ascii=False), "input_json_delta"
        out.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": opened}))
        for at in range(0, len(text), piece):
            field = "text" if delta == "text_delta" else "partial_json"
            change = {"type": delta, field: text[at : at + piece]}
            out.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": change}))
        out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    end = {"stop_reason": whole["stop_reason"], "stop_sequence": None}
    out.append(("message_delta", {"type": "message_delta", "delta": end, "usage": {**whole["usage"]}}))
    out.append(("message_stop", {"type": "message_stop"}))
    return out
