"""The decode activity's agent turns (`GenerateInput.messages`, issue 26): a request whose conversation extends the
trajectory's context is generated from the context's own tokens plus the new messages (the sampled tokens kept), and
one that rewrites the history fails non-retryably with `AgentContextMismatch`. The real tiny policy on the HF engine
and a local store, through Temporal's activity environment. A request with tools gets the completion's tool calls
parsed (a scripted policy on the tiny tokenizer with a tools template); on a template without tools it fails the
trajectory (`BadRequest`, not retried)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from trajflow.activities.decode import DecodeActivities
from trajflow.contracts import names
from trajflow.contracts.records import ChatMessage
from trajflow.contracts.trajectory import GenerateInput, SamplingParams
from trajflow.infra.store import LocalStore
from trajflow.rl.engines.hf import HFEngine
from trajflow.rl.engines.scripted import ScriptedEngine
from trajflow.rl.models import TOOLS_TEMPLATE

TOOLS = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}]


async def test_an_agents_turns_extend_the_context_and_a_rewritten_history_is_refused(
    tiny_model: Path, tmp_path: Path
) -> None:
    store = LocalStore(tmp_path / "store")
    engine = HFEngine(tiny_model, max_batch=1, batch_wait_ms=1)
    decode = DecodeActivities(engine, store, "agents", "w0")
    await engine.start()
    try:
        env = ActivityEnvironment()
        sampling = SamplingParams(temperature=0.0, max_new_tokens=6)
        first = [ChatMessage(role="system", content="You run commands."), ChatMessage(role="user", content="Go.")]

        def turn(k: int, messages: list[ChatMessage], context_uri: str | None) -> GenerateInput:
            return GenerateInput(
                trajectory_id="agent/r", turn=k, context_uri=context_uri, user_message="", messages=messages,
                sampling=sampling,
            )  # fmt: skip

        one = await env.run(decode.generate, turn(0, first, None))
        second = [*first, ChatMessage(role="assistant", content=one.text), ChatMessage(role="user", content="ok")]
        two = await env.run(decode.generate, turn(1, second, one.context_uri))
        ctx = decode.contexts.load(two.context_uri)
        assert [m.role for m in ctx.messages] == ["system", "user", "assistant", "user", "assistant"]
        start, end = ctx.turn_spans[0]
        assert end - start == one.completion_tokens and ctx.loss_mask[start:end] == [1] * one.completion_tokens
        before = decode.contexts.load(one.context_uri)
        assert ctx.token_ids[: len(before.token_ids)] == before.token_ids  # the first turn's tokens, as sampled
        assert two.prompt_tokens > len(before.token_ids) and ctx.loss_mask[end : two.prompt_tokens] == [0] * (
            two.prompt_tokens - end
        )  # the new message (and the turn's end) appended as prompt

        rewritten = [*first, ChatMessage(role="assistant", content="something else"), *second[3:]]
        with pytest.raises(ApplicationError) as refused:
            await env.run(decode.generate, turn(1, rewritten, one.context_uri))
        assert refused.value.type == names.ERR_CONTEXT_MISMATCH and refused.value.non_retryable
        assert "message 2 departs" in str(refused.value)
    finally:
        await engine.close()


async def test_a_request_with_tools_gets_the_tool_calls_or_fails_on_a_template_without_tools(
    tiny_model: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    reply = 'Looking.<tool_call>\n{"name": "ls", "arguments": {"dir": "."}}\n</tool_call>'
    engine = ScriptedEngine(tokenizer, reply, name="tiny")
    decode = DecodeActivities(engine, LocalStore(tmp_path / "store"), "agents", "w0")
    inp = GenerateInput(
        trajectory_id="agent/t", turn=2, context_uri=None, user_message="", tools=TOOLS,
        messages=[ChatMessage(role="user", content="list")], sampling=SamplingParams(max_new_tokens=64),
    )  # fmt: skip
    with pytest.raises(ApplicationError) as refused:
        await ActivityEnvironment().run(decode.generate, inp)
    assert refused.value.type == names.ERR_BAD_REQUEST and refused.value.non_retryable
    assert "chat template (tiny) has no tools" in str(refused.value)

    tokenizer.chat_template = TOOLS_TEMPLATE
    result = await ActivityEnvironment().run(decode.generate, inp)
    assert (result.text, result.finish_reason) == ("Looking.", "tool_calls")
    assert result.tool_calls is not None and [c.model_dump() for c in result.tool_calls] == [
        {"id": "call_2_0", "type": "function", "function": {"name": "ls", "arguments": '{"dir": "."}'}}
    ]
    ctx = decode.contexts.load(result.context_uri)
    assert ctx.messages[-1] == ChatMessage(role="assistant", content="Looking.", tool_calls=result.tool_calls)
    assert sum(ctx.loss_mask) == result.completion_tokens, "the sampled tokens, the raw tool call included"


async def test_a_request_with_stop_sequences_gets_the_answer_before_the_first(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    engine = ScriptedEngine(tokenizer, "Action: ls\nObservation: a.txt\nmore", name="tiny")
    decode = DecodeActivities(engine, LocalStore(tmp_path / "store"), "agents", "w0")
    first = [ChatMessage(role="user", content="list")]
    inp = GenerateInput(
        trajectory_id="agent/s", turn=0, context_uri=None, user_message="", stop=["Observation:"],
        messages=first, sampling=SamplingParams(max_new_tokens=64),
    )  # fmt: skip
    result = await ActivityEnvironment().run(decode.generate, inp)
    assert (result.text, result.finish_reason) == ("Action: ls\n", "stop")
    whole = len(tokenizer.encode("Action: ls\nObservation: a.txt\nmore", add_special_tokens=False)) + 1  # + EOS
    assert 0 < result.completion_tokens < whole, "the tokens after the stop string are dropped"
    ctx = decode.contexts.load(result.context_uri)
    assert sum(ctx.loss_mask) == result.completion_tokens and ctx.messages[-1].content == "Action: ls\n"
    # the program's next request echoes the answer as it got it: it extends the context
    nxt = [*first, ChatMessage(role="assistant", content=result.text), ChatMessage(role="user", content="a.txt")]
    follow = GenerateInput(
        trajectory_id="agent/s", turn=1, context_uri=result.context_uri, user_message="", messages=nxt,
        sampling=SamplingParams(max_new_tokens=64),
    )  # fmt: skip
    second = await ActivityEnvironment().run(decode.generate, follow)
    assert decode.contexts.load(second.context_uri).token_ids[: len(ctx.token_ids)] == ctx.token_ids
