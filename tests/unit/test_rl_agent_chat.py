"""trajflow.rl.chat's agent turns (`append_messages`): an agent sends its whole conversation with every request; a
request that extends the context appends only its new messages, keeping the sampled tokens exactly, and one that
departs from it is refused with where."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import AutoTokenizer

from trajflow.contracts.records import ChatMessage, TurnContext
from trajflow.rl.chat import ContextMismatch, append_completion, append_messages
from trajflow.rl.models import build_tiny_model


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("rl-agent-chat") / "tiny"))


def msgs(*pairs: tuple[str, str]) -> list[ChatMessage]:
    return [ChatMessage(role=r, content=c) for r, c in pairs]


def sample(tok: Any, ctx: TurnContext, text: str, version: int) -> tuple[TurnContext, list[int]]:
    """The engine's answer: `text` as tokens with EOS, and made-up logprobs."""
    ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    return append_completion(ctx, ids, [-0.25] * len(ids), text, version), ids


def test_a_first_request_is_rendered_whole(tokenizer: Any) -> None:
    first = msgs(("system", "You run commands."), ("user", "What is in README?"))
    ctx, prompt = append_messages(TurnContext(), tokenizer, first)
    expected = tokenizer.apply_chat_template(
        [m.model_dump() for m in first], tokenize=False, add_generation_prompt=True
    )
    assert tokenizer.decode(prompt) == expected and ctx.token_ids == prompt
    assert ctx.loss_mask == [0] * len(prompt) and ctx.messages == first


def test_requests_that_extend_the_context_append_only_their_new_messages(tokenizer: Any) -> None:
    first = msgs(("system", "You run commands."), ("user", "What is in README?"))
    ctx, _ = append_messages(TurnContext(), tokenizer, first)
    ctx, sampled = sample(tokenizer, ctx, "cat README", version=2)
    kept = list(ctx.token_ids)
    # the agent sends back everything, our answer as we gave it, and the command's output
    second = [*first, ChatMessage(role="assistant", content="cat README"), ChatMessage(role="user", content="hi")]
    ctx2, prompt = append_messages(ctx, tokenizer, second)
    assert prompt[: len(kept)] == kept  # the sampled tokens, exactly
    start, end = ctx2.turn_spans[0]
    assert ctx2.token_ids[start:end] == sampled and ctx2.loss_mask[start:end] == [1] * len(sampled)
    assert ctx2.loss_mask[len(kept) :] == [0] * (len(prompt) - len(kept))
    whole = tokenizer.apply_chat_template([m.model_dump() for m in second], tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(prompt) == whole  # ChatML: the seam is a special token, so the text is the template's
    ctx3, _ = sample(tokenizer, ctx2, "The README says hi.", version=3)
    assert ctx3.turn_versions == [2, 3] and len(ctx3.token_ids) == len(ctx3.logprobs) == len(ctx3.loss_mask)


def test_a_request_that_rewrites_the_history_is_refused_with_where(tokenizer: Any) -> None:
    first = msgs(("user", "List files."))
    ctx, _ = append_messages(TurnContext(), tokenizer, first)
    ctx, _ = sample(tokenizer, ctx, "ls", version=0)
    edited = [*first, ChatMessage(role="assistant", content="ls -la"), ChatMessage(role="user", content="a b")]
    with pytest.raises(ContextMismatch, match="message 1 departs.*assistant content differs") as found:
        append_messages(ctx, tokenizer, edited)
    assert found.value.index == 1
    summarised = msgs(("system", "Summary: listed files."), ("user", "Go on."))
    with pytest.raises(ContextMismatch, match="message 0 departs.*a system message where the context has a user one"):
        append_messages(ctx, tokenizer, summarised)
    with pytest.raises(ContextMismatch, match="adds no message"):
        append_messages(ctx, tokenizer, [*first, ChatMessage(role="assistant", content="ls")][:1])
    with pytest.raises(ValueError, match="must end with a message that is not the assistant's"):
        append_messages(ctx, tokenizer, [*first, ChatMessage(role="assistant", content="ls")])
