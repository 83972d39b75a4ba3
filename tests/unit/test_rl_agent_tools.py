"""Tool calls in agent turns: the completion's Hermes/Qwen `<tool_call>` blocks parsed (`trajflow.rl.tool_calls`),
and a tool round trip rendered by a chat template with tools (`trajflow.rl.models.TOOLS_TEMPLATE` on the tiny
model's tokenizer) token-faithfully (`trajflow.rl.chat.append_messages`); a template without tools is refused."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from transformers import AutoTokenizer

from trajflow.contracts.base import ChatMessage, ToolCall, ToolFunction
from trajflow.contracts.records import TurnContext
from trajflow.rl.chat import ContextMismatch, append_completion, append_messages
from trajflow.rl.models import TOOLS_TEMPLATE, build_tiny_model
from trajflow.rl.tool_calls import ToolsUnsupported, parse_tool_calls, supports_tools

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("rl-agent-tools") / "tiny"))


@pytest.fixture(scope="module")
def tools_tok(plain: Any) -> Any:
    tok = copy.deepcopy(plain)
    tok.chat_template = TOOLS_TEMPLATE
    return tok


def test_several_tool_calls_are_parsed_with_deterministic_ids() -> None:
    text = (
        'Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>\n'
        '<tool_call>{"name": "ls", "arguments": "{\\"dir\\": \\".\\"}"}</tool_call>'
    )
    content, calls = parse_tool_calls(text, turn=3)
    assert content == "Let me look."
    assert calls == [
        ToolCall(id="call_3_0", function=ToolFunction(name="read_file", arguments='{"path": "a.txt"}')),
        ToolCall(id="call_3_1", function=ToolFunction(name="ls", arguments='{"dir": "."}')),
    ]
    assert parse_tool_calls(text, turn=3) == (content, calls), "the same completion gives the same ids"


@pytest.mark.parametrize(
    "text",
    [
        "just an answer",
        '<tool_call>\n{"name": "read_file", "arguments": {"path": \n</tool_call>',  # bad JSON
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>\n{"name": "read_file", "arguments": {}}',  # never closed (cut by max_new_tokens)
    ],
)
def test_a_completion_without_a_readable_tool_call_stays_text(text: str) -> None:
    assert parse_tool_calls(text, turn=0) == (text, [])


def test_a_bad_block_stays_text_beside_a_good_one() -> None:
    text = '<tool_call>oops</tool_call> then <tool_call>{"name": "f", "arguments": {}}</tool_call>'
    content, calls = parse_tool_calls(text, turn=1)
    assert content == "<tool_call>oops</tool_call> then" and [c.function.name for c in calls] == ["f"]
    assert calls[0].id == "call_1_0" and calls[0].function.arguments == "{}"


def test_tools_need_a_template_with_tools(plain: Any, tools_tok: Any) -> None:
    assert supports_tools(tools_tok) and not supports_tools(plain)
    first = [ChatMessage(role="user", content="What is in a.txt?")]
    with pytest.raises(ToolsUnsupported, match=r"chat template \(tiny\) has no tools.*tools = true"):
        append_messages(TurnContext(model="tiny"), plain, first, TOOLS)
    call = ToolCall(id="c", function=ToolFunction(name="read_file", arguments="{}"))
    with_call = [*first, ChatMessage(role="assistant", content="", tool_calls=[call]), *first]
    with pytest.raises(ToolsUnsupported):  # a conversation with tool calls, even without tools
        append_messages(TurnContext(model="tiny"), plain, with_call)


def test_a_tool_round_trip_extends_the_context_token_faithfully(tools_tok: Any) -> None:
    first = [ChatMessage(role="system", content="Answer from files."), ChatMessage(role="user", content="a.txt?")]
    ctx, prompt = append_messages(TurnContext(model="tiny"), tools_tok, first, TOOLS)
    rendered = tools_tok.decode(prompt)
    assert '"name": "read_file"' in rendered and rendered.startswith("<|im_start|>system\nAnswer from files.")
    # the model writes a tool call with its own spacing; the tokens are kept as sampled, the message as parsed
    raw = '<tool_call>\n{"name":"read_file","arguments":{"path":"a.txt"}}\n</tool_call>'
    sampled = [*tools_tok.encode(raw, add_special_tokens=False), tools_tok.eos_token_id]
    content, calls = parse_tool_calls(raw, turn=0)
    ctx = append_completion(ctx, sampled, [-0.5] * len(sampled), content, 1, calls)
    kept = list(ctx.token_ids)
    # the program echoes the answer as the OpenAI client gives it (content null: ""), then the tool's result
    echoed = ChatMessage(role="assistant", content="", tool_calls=calls)
    result = ChatMessage(role="tool", content="hello", tool_call_id=calls[0].id)
    rewritten = ChatMessage(role="assistant", content="", tool_calls=[calls[0].model_copy(update={"id": "other"})])
    with pytest.raises(ContextMismatch, match="message 2 departs.*assistant tool calls or tool call id differs"):
        append_messages(ctx, tools_tok, [*first, rewritten, result], TOOLS)
    ctx2, prompt2 = append_messages(ctx, tools_tok, [*first, echoed, result], TOOLS)
    assert prompt2[: len(kept)] == kept, "the sampled tool call is never re-tokenised"
    start, end = ctx2.turn_spans[0]
    assert ctx2.token_ids[start:end] == sampled and ctx2.loss_mask[start:end] == [1] * len(sampled)
    delta = tools_tok.decode(prompt2[len(kept) :])
    assert delta == "\n<|im_start|>user\n<tool_response>\nhello\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert ctx2.messages[2] == echoed and json.loads(calls[0].function.arguments) == {"path": "a.txt"}
    final = tools_tok.encode("hello", add_special_tokens=False)
    ctx3 = append_completion(ctx2, final, [0.0] * len(final), "hello", 1)
    assert [m.role for m in ctx3.messages] == ["system", "user", "assistant", "tool", "assistant"]


def test_a_run_config_can_give_a_model_without_tools_the_hermes_tools_template(
    tmp_path_factory: pytest.TempPathFactory, plain: Any
) -> None:
    """`[model] chat_template = "hermes-tools"`: the engine renders with TOOLS_TEMPLATE (and submission lets a task
    with `tools = true` through); a plain conversation renders exactly as the model's own ChatML does."""
    from trajflow.contracts.config import ModelConfig
    from trajflow.rl.engines.load import load_engine

    cache = tmp_path_factory.mktemp("chat-template")
    own = load_engine(ModelConfig(name_or_path="tiny"), cache_dir=cache, device="cpu")
    hermes = load_engine(ModelConfig(name_or_path="tiny", chat_template="hermes-tools"), cache_dir=cache, device="cpu")
    assert not supports_tools(own.tokenizer) and supports_tools(hermes.tokenizer)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    same = [t.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) for t in (plain, hermes.tokenizer)]
    assert same[0] == same[1]
    with pytest.raises(ValueError, match="chat_template"):
        ModelConfig(name_or_path="tiny", chat_template="qwen")  # type: ignore[arg-type]
