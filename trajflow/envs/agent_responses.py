"""OpenAI's Responses API on the agent endpoint (`POST /v1/responses`, `agent_http.py`): a request is translated into
the chat-completions body that the endpoint checks and records (`to_chat`), and the model's answer is rendered as a
`response` object (`response`), or for `stream: true` as its server-sent events (`events`), as the `openai` client
parses them (the Codex CLI speaks this API).

Translation: `instructions` -> a system message first; `input` as a string -> one user message; input items: a message
(`role` user / system / developer / assistant, its content a string or `input_text` / `output_text` parts) -> that
message; `function_call` items -> `tool_calls` of the assistant message right before them (or of a new one with no
content), so that a response sent back as input is the assistant turn as it was recorded; `function_call_output` ->
a `tool` message; `reasoning` items are skipped (none are produced). `tools` (function tools: name, description,
parameters) -> function tools; `tool_choice` as given (a `{"type": "function", "name"}` -> that function);
`max_output_tokens`, `temperature`, `top_p`. The answer's finish reason `length` is status `incomplete`
(`max_output_tokens`); every other is `completed`.

Ignored: `store`, `include`, `reasoning`, `text`, `parallel_tool_calls`, `metadata`, `truncation`, `user`. Refused with
HTTP 400 (OpenAI's error shape): `previous_response_id` (nothing is stored: send the whole input), tools that are not
functions (web search, file search, computer use), input parts that are not text, and anything malformed. Limits:
stdlib only (it runs beside the runner in the sandbox).
"""

from __future__ import annotations

import time
from typing import Any

API = "openai.responses"
"""The observation's `api` for a Responses request."""


class BadResponses(ValueError):
    """A Responses request that cannot be translated (the endpoint answers 400)."""


def to_chat(request: object) -> dict[str, Any]:
    """A Responses request body (parsed JSON) -> the chat-completions body it means; raises BadResponses."""
    if not isinstance(request, dict):
        raise BadResponses("the request body must be a JSON object")
    if request.get("previous_response_id") is not None:
        raise BadResponses("previous_response_id is not supported: nothing is stored here; send the whole input")
    chat: list[dict[str, Any]] = []
    if request.get("instructions") is not None:
        chat.append({"role": "system", "content": _text(request["instructions"], "instructions")})
    given = request.get("input")
    if isinstance(given, str):
        chat.append({"role": "user", "content": given})
    elif isinstance(given, list) and given:
        for index, item in enumerate(given):
            _add(chat, index, item)
    else:
        raise BadResponses("input: must be a string or a non-empty list of items")
    body: dict[str, Any] = {"messages": chat, "stream": bool(request.get("stream"))}
    for theirs, ours in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p")):
        if request.get(theirs) is not None:
            body[ours] = request[theirs]
    if isinstance(request.get("model"), str):
        body["model"] = request["model"]
    tools = request.get("tools")
    if tools:
        if not isinstance(tools, list):
            raise BadResponses("tools: must be a list")
        body["tools"] = [_tool(i, tool) for i, tool in enumerate(tools)]
    choice = request.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        body["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice in ("auto", "none", "required"):
        body["tool_choice"] = choice
    elif choice is not None:
        raise BadResponses(f"tool_choice: expected auto, none, required or a function, got {choice!r:.200}")
    return body


def _text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadResponses(f"{where}: must be a string or a list of text parts")
    parts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise BadResponses(f"{where}[{i}]: only text parts are supported, got {kind or type(part).__name__!r}")
        parts.append(part["text"])
    return "".join(parts)


def _add(chat: list[dict[str, Any]], index: int, item: object) -> None:
    """Append the input item `item` to the chat messages `chat`."""
    where = f"input[{index}]"
    if not isinstance(item, dict):
        raise BadResponses(f"{where}: must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise BadResponses(f"{where}: a message's role must be user, system, developer or assistant, got {role!r}")
        chat.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
    elif kind == "function_call":
        if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str):
            raise BadResponses(f"{where}: a function_call needs a name and a call_id")
        function = {"name": item["name"], "arguments": item.get("arguments") or ""}
        call = {"id": item["call_id"], "type": "function", "function": function}
        last = chat[-1] if chat else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
            if last["content"] == "":
                last["content"] = None
        else:
            chat.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise BadResponses(f"{where}: a function_call_output needs a call_id")
        output = item.get("output")
        text = output if isinstance(output, str) else _text(output, f"{where}.output")
        chat.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
    elif kind != "reasoning":
        raise BadResponses(f"{where}: input items of type {kind!r} are not supported")


def _tool(index: int, tool: object) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise BadResponses(f"tools[{index}]: only function tools (with a name) are supported, got {kind!r}")
    function = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object"}}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def response(
    content: str | None, tool_calls: list[dict[str, Any]], finish: str, usage: dict[str, Any], model: str, call: int
) -> dict[str, Any]:
    """The answer as a Responses `response` object."""
    output: list[dict[str, Any]] = []
    if content:
        part = {"type": "output_text", "text": content, "annotations": [], "logprobs": []}
        message = {"type": "message", "id": f"msg_trajflow_{call}", "status": "completed", "role": "assistant"}
        output.append({**message, "content": [part]})
    for index, tool_call in enumerate(tool_calls):
        function = tool_call["function"]
        output.append(
            {
                "type": "function_call",
                "id": f"fc_trajflow_{call}_{index}",
                "call_id": tool_call["id"],
                "name": function["name"],
                "arguments": function.get("arguments") or "",
                "status": "completed",
            }
        )
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    incomplete = finish == "length"
    return {
        "id": f"resp_trajflow_{call}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        },
    }


def events(whole: dict[str, Any], piece: int) -> list[tuple[str, dict[str, Any]]]:
    """The (event, data) pairs that stream the `response` `whole`: created, each output item added, its text or
    arguments in pieces of `piece` characters, done, then completed (or incomplete)."""
    out: list[tuple[str, dict[str, Any]]] = []

    def emit(kind: str, **data: Any) -> None:
        out.append((kind, {"type": kind, "sequence_number": len(out), **data}))

    emit("response.created", response={**whole, "status": "in_progress", "output": [], "usage": None})
    emit("response.in_progress", response={**whole, "status": "in_progress", "output": [], "usage": None})
    for index, item in enumerate(whole["output"]):
        if item["type"] == "message":
            emit(
                "response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []}
            )
            text, where = item["content"][0]["text"], {"item_id": item["id"], "output_index": index, "content_index": 0}
            emit("response.content_part.added", **where, part={**item["content"][0], "text": ""})
            for at in range(0, len(text), piece):
                emit("response.output_text.delta", **where, delta=text[at : at + piece], logprobs=[])
            emit("response.output_text.done", **where, text=text, logprobs=[])
            emit("response.content_part.done", **where, part=item["content"][0])
        else:
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "arguments": ""},
            )
            arguments, where = item["arguments"], {"item_id": item["id"], "output_index": index}
            for at in range(0, len(arguments), piece):
                emit("response.function_call_arguments.delta", **where, delta=arguments[at : at + piece])
            emit("response.function_call_arguments.done", **where, arguments=arguments, name=item["name"])
        emit("response.output_item.done", output_index=index, item=item)
    emit(f"response.{whole['status']}", response=whole)
    return out
