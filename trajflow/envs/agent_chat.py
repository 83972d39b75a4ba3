"""OpenAI's Chat Completions answer formats on the agent endpoint (`agent_http.py`): the model's `Answer` as a
`chat.completion` object, or as the `chat.completion.chunk` objects of a stream, as the `openai` client parses them.
Limits: stdlib only (it runs beside the runner in the sandbox).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STREAM_PIECE = 16
"""Characters of content or tool-call arguments per streamed delta (the stream must reassemble, not be fast)."""


@dataclass(frozen=True)
class Answer:
    """The model's answer to one chat request (`parse_action` makes it from a step's action)."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"
    usage: dict[str, Any] = field(default_factory=dict)


def completion(answer: Answer, model: str, call_id: str, created: int) -> dict[str, Any]:
    """The `chat.completion` object that answers a non-streaming request."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if answer.tool_calls:
        message["tool_calls"] = answer.tool_calls
    return {
        "id": call_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": answer.finish_reason, "logprobs": None}],
        "usage": _usage(answer),
    }


def chunks(answer: Answer, model: str, call_id: str, created: int, include_usage: bool) -> list[dict[str, Any]]:
    """The `chat.completion.chunk` objects of a streamed answer: role, content pieces, tool-call deltas (the first
    of each call carries its id, type and name), the finish reason, and the usage when the request asked for it."""
    head = {"id": call_id, "object": "chat.completion.chunk", "created": created, "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": piece}) for piece in _pieces(answer.content or "")]
    for index, call in enumerate(answer.tool_calls):
        function = call.get("function", {})
        first = {"name": function.get("name", ""), "arguments": ""}
        out.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function", "function": first}]}))
        for piece in _pieces(function.get("arguments", "")):
            out.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    out.append(chunk({}, answer.finish_reason))
    if include_usage:
        out.append({**head, "choices": [], "usage": _usage(answer)})
    return out


def _pieces(text: str) -> list[str]:
    return [text[i : i + STREAM_PIECE] for i in range(0, len(text), STREAM_PIECE)]


def _usage(answer: Answer) -> dict[str, Any]:
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    usage.update({k: v for k, v in answer.usage.items() if isinstance(v, int) and not isinstance(v, bool)})
    return usage
