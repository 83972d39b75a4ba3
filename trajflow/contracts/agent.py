"""An agent's turn (`agent:MODULE:FUNCTION` envs, `trajflow/envs/agent.py`): its chat request, read from the env's
observation, and the model's answer, written as the env's action.

The sandbox's endpoint hands each chat-completions request to the trajectory workflow as an observation: the
request normalised to JSON (`trajflow.envs.agent_http.normalize_request`). `AgentRequest.parse` reads it and
`generate_input` makes the decode pool's request of it: the conversation as `messages` (which must extend the
trajectory's context: `trajflow.rl.chat.append_messages`), sampled with the task's own sampling (an RL run's
behaviour policy is the run's, not the program's: the request's temperature, top_p and seed are not used), its
`max_tokens` a cap on the task's `max_new_tokens`. `answer_action` is what goes back: the completion's text, finish
reason and token counts as the JSON action the endpoint answers the program with.

Tools: a request's `tools` go with it to the decode pool (`GenerateInput.tools`), where the model's chat template
renders them with the conversation's tool calls (an assistant message's `tool_calls`, OpenAI format, `content` null
read as empty) and tool results (`tool` messages with their `tool_call_id`); the completion's tool calls are parsed
there (`trajflow.rl.tool_calls`: Hermes/Qwen `<tool_call>` blocks, ids `call_<turn>_<i>`) and come back in the answer
with finish reason `tool_calls`. A model whose template has no tools fails the trajectory (`failed`) saying so; a task
that declares `tools = true` is refused at submission instead.

Stop sequences (up to `MAX_STOPS`) go to the decode pool too (`GenerateInput.stop`): the answer ends before the first
(`trajflow.rl.stops`, the tokens kept up to the one that completed it).

Limits: a request with a content part that is not text is refused with `AgentRequestError`; `tool_choice` is not
used (the model decides); a tool message's `name` and the legacy `function_call` are not read. Runs inside workflows:
pure, no I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from trajflow.contracts.base import ChatMessage, ToolCall, ToolFunction
from trajflow.contracts.env_ids import AGENT_CMD_PREFIX as AGENT_CMD_PREFIX
from trajflow.contracts.env_ids import AGENT_PREFIX as AGENT_PREFIX
from trajflow.contracts.env_ids import is_agent as is_agent
from trajflow.contracts.trajectory import GenerateInput, SamplingParams

DEFAULT_BUDGET_S = 600.0
"""How long a program may work between an answer and its next request (`env_kwargs["budget_s"]`; the runner's own
constant of the same value, `trajflow.envs.agent.DEFAULT_BUDGET_S`, decides when it is `hung`)."""
STEP_MARGIN_S = 30.0
"""How much longer than the program's budget a reset or step of an agent env may take before its sandbox is taken
for lost (the runner's `hung` comes first)."""
MAX_STOPS = 4
"""As OpenAI's chat completions: at most four stop sequences a request."""
ROLES = ("system", "user", "assistant", "tool")
"""The roles a context holds; `developer` is read as `system`."""


class AgentRequestError(ValueError):
    """A request the policy cannot answer as asked (the message says what and why)."""


def budget_s(env_kwargs: Mapping[str, object]) -> float:
    """The program's budget between calls, as the runner reads it (a bad value: the default; the runner refuses it)."""
    value = env_kwargs.get("budget_s", DEFAULT_BUDGET_S)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return DEFAULT_BUDGET_S
    return float(value)


def call_s(env_kwargs: Mapping[str, object]) -> float:
    """The longest one reset or step of an agent env may take: its program's budget plus the margin; twice the budget
    with a verifier (`env_kwargs["verifier"]`), which may take the budget again after the program's last call."""
    return budget_s(env_kwargs) * (2 if env_kwargs.get("verifier") is not None else 1) + STEP_MARGIN_S


class AgentRequest:
    """One chat request of an agent program, as its turn's observation carries it."""

    def __init__(
        self,
        messages: list[ChatMessage],
        max_tokens: int | None,
        call: int,
        tools: list[dict[str, Any]] | None = None,
        stop: list[str] | None = None,
    ) -> None:
        self.messages = messages
        self.max_tokens = max_tokens
        self.call = call
        self.tools = tools
        self.stop = stop

    @classmethod
    def parse(cls, observation: str) -> AgentRequest:
        """Read an agent env's observation; raises AgentRequestError for what the policy cannot answer."""
        try:
            request = json.loads(observation)
        except ValueError as e:
            raise AgentRequestError(f"the agent's request is not JSON ({e}): {observation[:200]!r}") from e
        if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
            raise AgentRequestError(f"the agent's request has no messages: {observation[:200]!r}")
        call = request.get("call")
        where = f"chat request {call}"
        tools = request.get("tools") or None
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise AgentRequestError(f"{where}: 'tools' must be a list of objects")
        sampling = request.get("sampling") or {}
        stop = sampling.get("stop") or None
        if stop is not None and (
            not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > MAX_STOPS
        ):
            raise AgentRequestError(f"{where} sets stop={stop!r}: expected up to {MAX_STOPS} non-empty strings")
        max_tokens = sampling.get("max_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise AgentRequestError(f"{where} sets max_tokens={max_tokens!r}: expected a positive integer")
        messages = [_message(where, i, m) for i, m in enumerate(request["messages"])]
        return cls(messages, max_tokens, call if isinstance(call, int) else 0, tools, stop)

    def generate_input(
        self, trajectory_id: str, turn: int, context_uri: str | None, sampling: SamplingParams, **request: Any
    ) -> GenerateInput:
        """The decode request of this turn: the task's `sampling` (seeded per turn), `max_tokens` as a cap."""
        params = sampling.for_turn(turn)
        if self.max_tokens is not None and self.max_tokens < params.max_new_tokens:
            params = params.model_copy(update={"max_new_tokens": self.max_tokens})
        return GenerateInput(
            trajectory_id=trajectory_id,
            turn=turn,
            context_uri=context_uri,
            user_message="",
            messages=self.messages,
            tools=self.tools,
            stop=self.stop,
            sampling=params,
            **request,
        )


def request_digest(observation: str) -> str:
    """What a restore compares an agent's replayed request with (`EnvResetInput.expect_digests`): the sha256 of the
    observation, so a reset's input stays small however long the conversations grow."""
    return hashlib.sha256(observation.encode()).hexdigest()


def answer_action(
    text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int, tool_calls: list[ToolCall] | None = None
) -> str:
    """The env action that answers an agent's request (`trajflow.envs.agent_http.parse_action` reads it); with tool
    calls an empty text is `null` content, as the OpenAI API writes it."""
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    reason = finish_reason if finish_reason in ("stop", "length", "tool_calls") else "stop"
    answer: dict[str, Any] = {"content": text, "finish_reason": reason, "usage": usage}
    if tool_calls:
        answer["tool_calls"] = [c.model_dump() for c in tool_calls]
        answer["content"] = text or None
    return json.dumps(answer, sort_keys=True)


def _message(where: str, index: int, message: object) -> ChatMessage:
    if not isinstance(message, dict):
        raise AgentRequestError(f"{where}: messages[{index}] is not an object")
    role = "system" if message.get("role") == "developer" else message.get("role")
    if role not in ROLES or message.get("function_call"):
        raise AgentRequestError(
            f"{where}: messages[{index}] is a {message.get('role')!r} message"
            f"{' with a function_call' if message.get('function_call') else ''}: "
            f"expected one of {', '.join(ROLES)} (tool calls as `tool_calls`)"
        )
    calls = _tool_calls(where, index, message.get("tool_calls")) if role == "assistant" else None
    call_id = message.get("tool_call_id") if role == "tool" else None
    if call_id is not None and not isinstance(call_id, str):
        raise AgentRequestError(f"{where}: messages[{index}] has a tool_call_id that is not a string")
    content = message.get("content")
    if content is None and calls:
        content = ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise AgentRequestError(f"{where}: messages[{index}] has a {kind!r} part: only text is supported")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise AgentRequestError(f"{where}: messages[{index}] has no text content")
    return ChatMessage(role=role, content=content, tool_calls=calls, tool_call_id=call_id)


def _tool_calls(where: str, index: int, calls: object) -> list[ToolCall] | None:
    """An assistant message's tool calls (OpenAI format, arguments a JSON string)."""
    if not calls:
        return None
    if not isinstance(calls, list):
        raise AgentRequestError(f"{where}: messages[{index}].tool_calls is not a list")
    out = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(call, dict) and isinstance(call.get("id"), str) and isinstance(function, dict)) or not (
            isinstance(function.get("name"), str) and isinstance(function.get("arguments"), str)
        ):
            raise AgentRequestError(
                f"{where}: messages[{index}].tool_calls[{i}] must be "
                "{'id': str, 'type': 'function', 'function': {'name': str, 'arguments': str}}"
            )
        out.append(
            ToolCall(id=call["id"], function=ToolFunction(name=function["name"], arguments=function["arguments"]))
        )
    return out
