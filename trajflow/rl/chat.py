"""The token-level multi-turn context: chat formatting on our side, never re-tokenising the past.

A trajectory's `TurnContext` grows by two operations, alternating:
- `append_user` adds a user message (an observation) and returns the prompt ids to generate from;
- `append_completion` adds the tokens the engine sampled, with their logprobs, as the assistant's turn.
An agent program (issue 26's `agent:` envs) sends its whole conversation with every request instead:
`append_messages` checks that the request extends the context (its first messages are the context's, the assistant
turns exactly as sampled) and appends only its new messages the same way, or raises `ContextMismatch` saying where
it departs (an agent that rewrote its history: the caller records it, and never trains on a re-tokenised past).

Earlier token ids are never re-derived from text: the sampled tokens stay exactly the tokens that were sampled,
so their logprobs stay valid for training. The new user message is added as a *delta*: the text difference
between the chat template rendered with and without it, tokenized on its own and appended.

The end of an assistant turn needs care. The template closes an assistant message with a suffix (ChatML:
`<|im_end|>\\n`). A completion that stopped on EOS already contains the EOS token (`<|im_end|>`); one cut by
`max_new_tokens` contains none of it. We append only the part of the suffix that the sampled tokens lack, so
nothing is duplicated and nothing is missing.

Limits:
- The template must be append-only: rendering N+1 messages must start with the rendering of the first N. Templates
  that rewrite earlier turns (e.g. ones that drop the reasoning of past assistant turns) raise `ValueError`.
- The delta is tokenized on its own, so at the seam the token split may differ from tokenising the whole text
  at once. With ChatML the seam is a special token, so the split is the same.
- The rendering of an assistant turn uses the decoded text; that only matters to locate the turn's end suffix.
- Messages must alternate: `append_user` needs an empty context or one that ends with a completion.
- Tools (an agent's request with `tools`, assistant tool calls, `tool` results) are rendered by the model's own chat
  template (`tools=` of `apply_chat_template`, tool-call arguments as objects where they are JSON objects); a template
  without tools raises `ToolsUnsupported` (`trajflow.rl.tool_calls`). The context keeps an answer's *parsed* message
  (content and tool calls, as the program echoes it back) beside the sampled tokens, so the next request compares
  equal; only its rendering locates the turn's end, never its tokens.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from trajflow.contracts.base import ToolCall
from trajflow.contracts.records import ChatMessage, TurnContext
from trajflow.rl.tool_calls import require_tools

Tools = list[dict[str, Any]] | None

_SENTINEL = "\u2063trajflow-end-of-content\u2063"


class ChatTokenizer(Protocol):
    """What chat formatting needs of a Hugging Face tokenizer."""

    eos_token: Any
    eos_token_id: Any

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def convert_ids_to_tokens(self, ids: Any) -> Any: ...


def _render(
    tokenizer: ChatTokenizer, messages: list[dict[str, Any]], generation_prompt: bool, tools: Tools = None
) -> str:
    kwargs: dict[str, Any] = {"tools": tools} if tools else {}
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs)
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected str")
    return text


def _arguments(text: str) -> object:
    """A tool call's arguments as templates expect them: the object its JSON holds, else the string itself."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def _as_dict(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": c.type,
                "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)},
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def _as_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    return [_as_dict(m) for m in messages]


def _encode(tokenizer: ChatTokenizer, text: str) -> list[int]:
    # Special tokens come from the template text itself; never let the tokenizer add a BOS of its own.
    return list(tokenizer.encode(text, add_special_tokens=False))


def assistant_turn_suffix(tokenizer: ChatTokenizer, history: list[dict[str, Any]], tools: Tools = None) -> str:
    """The text the template writes after an assistant message's content (ChatML: `<|im_end|>\\n`)."""
    probe = [*history, {"role": "assistant", "content": _SENTINEL}]
    rendered = _render(tokenizer, probe, generation_prompt=False, tools=tools)
    index = rendered.rfind(_SENTINEL)
    if index < 0:
        raise ValueError("the chat template does not render assistant messages verbatim; cannot find the turn end")
    return rendered[index + len(_SENTINEL) :]


def _eos_ids(tokenizer: ChatTokenizer) -> set[int]:
    eos = tokenizer.eos_token_id
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, list) else {int(eos)}


def _missing_turn_end(tokenizer: ChatTokenizer, ctx: TurnContext, tools: Tools) -> str:
    """The part of the last assistant turn's end suffix that the sampled tokens do not contain."""
    history = _as_dicts(ctx.messages[:-1])
    suffix = assistant_turn_suffix(tokenizer, history, tools)
    start, end = ctx.turn_spans[-1]
    last_token = ctx.token_ids[end - 1] if end > start else None
    if last_token is not None and last_token in _eos_ids(tokenizer):
        eos_text = str(tokenizer.convert_ids_to_tokens(last_token))
        if suffix.startswith(eos_text):
            return suffix[len(eos_text) :]
    return suffix


def _check_alternation(ctx: TurnContext) -> None:
    if not ctx.messages:
        return
    if ctx.messages[-1].role != "assistant" or not ctx.turn_spans:
        raise ValueError("append_user needs an empty context or one that ends with an assistant completion")
    if ctx.turn_spans[-1][1] != len(ctx.token_ids):
        raise ValueError("the context's last turn span does not end at the last token")


def append_user(
    ctx: TurnContext, tokenizer: ChatTokenizer, user_text: str, system_prompt: str
) -> tuple[TurnContext, list[int]]:
    """Add a user message; return the new context and the full prompt ids (ending with the generation prompt).

    `system_prompt` is used on the first turn only (empty means the template's default, if any). New prompt tokens
    get loss mask 0 and logprob 0.0; earlier tokens are kept exactly.
    """
    _check_alternation(ctx)
    user = ChatMessage(role="user", content=user_text)
    system = [ChatMessage(role="system", content=system_prompt)] if system_prompt and not ctx.messages else []
    return _extend(ctx, tokenizer, [*ctx.messages, *system, user])


def _extend(
    ctx: TurnContext, tokenizer: ChatTokenizer, messages: list[ChatMessage], tools: Tools = None
) -> tuple[TurnContext, list[int]]:
    """The context with `messages` (the context's own, then new ones) and its prompt ids: on an empty context the
    whole conversation rendered, otherwise the new messages rendered as a delta after the last sampled turn (with
    the part of its end the sampled tokens lack). New tokens get mask 0 and logprob 0.0."""
    if not ctx.messages:
        delta_ids = _encode(tokenizer, _render(tokenizer, _as_dicts(messages), generation_prompt=True, tools=tools))
    else:
        before = _render(tokenizer, _as_dicts(ctx.messages), generation_prompt=False, tools=tools)
        after = _render(tokenizer, _as_dicts(messages), generation_prompt=True, tools=tools)
        if not after.startswith(before):
            raise ValueError("the chat template is not append-only: adding a message changed earlier text")
        delta_ids = _encode(tokenizer, _missing_turn_end(tokenizer, ctx, tools) + after[len(before) :])
    new_ctx = ctx.model_copy(
        update={
            "messages": list(messages),
            "token_ids": [*ctx.token_ids, *delta_ids],
            "logprobs": [*ctx.logprobs, *([0.0] * len(delta_ids))],
            "loss_mask": [*ctx.loss_mask, *([0] * len(delta_ids))],
        }
    )
    return new_ctx, list(new_ctx.token_ids)


class ContextMismatch(ValueError):
    """An agent's request does not extend its trajectory's context: `index` is the first message that differs."""

    def __init__(self, index: int, why: str) -> None:
        super().__init__(f"the request's message {index} departs from the trajectory's context: {why}")
        self.index = index


def append_messages(
    ctx: TurnContext, tokenizer: ChatTokenizer, messages: list[ChatMessage], tools: Tools = None
) -> tuple[TurnContext, list[int]]:
    """An agent's turn: `messages` is its request's whole conversation, `tools` its request's tools. On an empty
    context it is rendered whole; otherwise it must extend the context (`ContextMismatch` if not) and only the
    messages after it are appended, as a delta after the last sampled turn. Returns the new context and the full
    prompt ids, ending with the generation prompt. New tokens get mask 0 and logprob 0.0; earlier tokens are kept
    exactly. Tools, tool calls or tool results on a template without tools raise `ToolsUnsupported`."""
    if not messages or messages[-1].role == "assistant":
        raise ValueError("an agent's request must end with a message that is not the assistant's")
    if tools or any(m.tool_calls or m.role == "tool" for m in messages):
        require_tools(tokenizer, ctx.model or str(getattr(tokenizer, "name_or_path", "")))
    if ctx.messages:
        _check_alternation(ctx)
        for i, (mine, theirs) in enumerate(zip(ctx.messages, messages, strict=False)):
            if mine != theirs:
                why = f"a {theirs.role} message where the context has a {mine.role} one"
                if mine.role == theirs.role:
                    what = "content" if mine.content != theirs.content else "tool calls or tool call id"
                    why = f"its {mine.role} {what} differs from what the context holds"
                raise ContextMismatch(i, why)
        if len(messages) <= len(ctx.messages):
            raise ContextMismatch(len(messages), "it adds no message to the context")
    return _extend(ctx, tokenizer, messages, tools)


def append_completion(
    ctx: TurnContext,
    completion_ids: list[int],
    completion_logprobs: list[float],
    text: str,
    version: int,
    tool_calls: list[ToolCall] | None = None,
) -> TurnContext:
    """Add the sampled tokens (mask 1, their logprobs) as the assistant's turn, with its policy version and span;
    the turn's message is `text` with `tool_calls` (the completion as parsed: `trajflow.rl.tool_calls`)."""
    if len(completion_ids) != len(completion_logprobs):
        raise ValueError(
            f"{len(completion_ids)} completion ids but {len(completion_logprobs)} logprobs: they must be aligned"
        )
    if not ctx.messages or ctx.messages[-1].role == "assistant":
        raise ValueError("append_completion needs a context that ends with a user (or an agent's tool) message")
    start = len(ctx.token_ids)
    end = start + len(completion_ids)
    return ctx.model_copy(
        update={
            "messages": [*ctx.messages, ChatMessage(role="assistant", content=text, tool_calls=tool_calls or None)],
            "token_ids": [*ctx.token_ids, *completion_ids],
            "logprobs": [*ctx.logprobs, *(float(x) for x in completion_logprobs)],
            "loss_mask": [*ctx.loss_mask, *([1] * len(completion_ids))],
            "turn_versions": [*ctx.turn_versions, version],
            "turn_spans": [*ctx.turn_spans, (start, end)],
        }
    )
