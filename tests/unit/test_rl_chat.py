"""trajflow.rl.chat: the token-level context grows by deltas, keeps earlier tokens exactly, and keeps its arrays
aligned."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import AutoTokenizer

from trajflow.contracts.records import TurnContext
from trajflow.rl.chat import append_completion, append_user, assistant_turn_suffix
from trajflow.rl.models import build_tiny_model

SMOLLM2_STYLE_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("rl-chat") / "tiny"))


def _aligned(ctx: TurnContext) -> None:
    assert len(ctx.token_ids) == len(ctx.logprobs) == len(ctx.loss_mask)
    assert len(ctx.turn_spans) == len(ctx.turn_versions)


def _complete(tok: Any, ctx: TurnContext, text: str, *, eos: bool = True, version: int = 0) -> TurnContext:
    ids = tok.encode(text, add_special_tokens=False) + ([tok.eos_token_id] if eos else [])
    logprobs = [-0.5 - 0.01 * i for i in range(len(ids))]
    return append_completion(ctx, ids, logprobs, text, version)


def test_first_turn_renders_the_chat_template(tokenizer: Any) -> None:
    ctx, prompt = append_user(TurnContext(), tokenizer, "Guess!", "Be brief.")
    expected = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Guess!"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert tokenizer.decode(prompt) == expected
    assert prompt == ctx.token_ids
    assert ctx.loss_mask == [0] * len(prompt) and ctx.logprobs == [0.0] * len(prompt)
    assert [m.role for m in ctx.messages] == ["system", "user"]
    _aligned(ctx)
    no_system, _ = append_user(TurnContext(), tokenizer, "Guess!", "")
    assert [m.role for m in no_system.messages] == ["user"]
    assert tokenizer.decode(no_system.token_ids).startswith("<|im_start|>user\n")


def test_completion_gets_mask_one_logprobs_version_and_span(tokenizer: Any) -> None:
    ctx, prompt = append_user(TurnContext(), tokenizer, "Guess!", "Be brief.")
    done = _complete(tokenizer, ctx, "\\boxed{5}", version=3)
    _aligned(done)
    start, end = done.turn_spans[0]
    assert (start, end) == (len(prompt), len(done.token_ids))
    assert done.turn_versions == [3]
    assert done.loss_mask[start:end] == [1] * (end - start)
    assert done.logprobs[start:end] == pytest.approx([-0.5 - 0.01 * i for i in range(end - start)])
    assert done.messages[-1].role == "assistant" and done.messages[-1].content == "\\boxed{5}"
    with pytest.raises(ValueError, match="aligned"):
        append_completion(ctx, [1, 2], [0.0], "x", 0)


def test_three_turns_keep_earlier_tokens_and_decode_each_message_once(tokenizer: Any) -> None:
    ctx, _ = append_user(TurnContext(), tokenizer, "first observation", "system words")
    snapshots: list[list[int]] = []
    for turn, (reply, observation) in enumerate(
        [("answer one", "second observation"), ("answer two", "third observation")]
    ):
        ctx = _complete(tokenizer, ctx, reply, version=turn)
        snapshots.append(list(ctx.token_ids))
        ctx, prompt = append_user(ctx, tokenizer, observation, "ignored later")
        assert prompt == ctx.token_ids
        for earlier in snapshots:
            assert ctx.token_ids[: len(earlier)] == earlier
        _aligned(ctx)
    ctx = _complete(tokenizer, ctx, "answer three", version=2)
    _aligned(ctx)
    text = tokenizer.decode(ctx.token_ids)
    full = tokenizer.apply_chat_template(
        [m.model_dump() for m in ctx.messages], tokenize=False, add_generation_prompt=False
    )
    assert text + "\n" == full  # identical to rendering the whole chat, minus the final turn's newline
    for needle in [
        "system words",
        "first observation",
        "answer one",
        "second observation",
        "answer two",
        "third observation",
        "answer three",
    ]:
        assert text.count(needle) == 1
    assert "ignored later" not in text
    assert text.count("<|im_end|>") == 7
    assert ctx.turn_versions == [0, 1, 2]
    masked = [t for t, m in zip(ctx.token_ids, ctx.loss_mask, strict=True) if m == 1]
    assert tokenizer.decode(masked) == "answer one<|im_end|>answer two<|im_end|>answer three<|im_end|>"


def test_truncated_completion_gets_its_turn_closed(tokenizer: Any) -> None:
    ctx, _ = append_user(TurnContext(), tokenizer, "obs", "")
    ctx = _complete(tokenizer, ctx, "cut off mid", eos=False)
    ctx, prompt = append_user(ctx, tokenizer, "next", "")
    text = tokenizer.decode(prompt)
    assert "cut off mid<|im_end|>\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n" in text
    assert text.count("<|im_end|>") == 3


def test_template_with_default_system_prompt(tokenizer: Any) -> None:
    tokenizer.chat_template = SMOLLM2_STYLE_TEMPLATE
    try:
        ctx, _ = append_user(TurnContext(), tokenizer, "obs", "")
        ctx = _complete(tokenizer, ctx, "act")
        ctx, prompt = append_user(ctx, tokenizer, "obs2", "")
        text = tokenizer.decode(prompt)
        assert text.count("You are a helpful AI assistant") == 1
        assert text.endswith("act<|im_end|>\n<|im_start|>user\nobs2<|im_end|>\n<|im_start|>assistant\n")
    finally:
        tokenizer.chat_template = AutoTokenizer.from_pretrained(tokenizer.name_or_path).chat_template


def test_turn_suffix_of_chatml(tokenizer: Any) -> None:
    assert assistant_turn_suffix(tokenizer, [{"role": "user", "content": "u"}]) == "<|im_end|>\n"


def test_misuse_is_rejected(tokenizer: Any) -> None:
    ctx, _ = append_user(TurnContext(), tokenizer, "obs", "")
    with pytest.raises(ValueError, match="ends with an assistant"):
        append_user(ctx, tokenizer, "again", "")
    done = _complete(tokenizer, ctx, "act")
    with pytest.raises(ValueError, match="ends with a user"):
        append_completion(done, [1], [0.0], "x", 0)


def test_non_append_only_template_is_rejected(tokenizer: Any) -> None:
    ctx, _ = append_user(TurnContext(), tokenizer, "obs", "")
    ctx = _complete(tokenizer, ctx, "act")
    original = tokenizer.chat_template
    tokenizer.chat_template = (
        "{% for m in messages[-1:] %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    try:
        with pytest.raises(ValueError, match="append-only"):
            append_user(ctx, tokenizer, "obs2", "")
    finally:
        tokenizer.chat_template = original
