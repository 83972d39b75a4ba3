"""Stop sequences applied to a sampled completion (`trajflow.rl.stops`), on the tiny model's real tokenizer: the
answer ends before the first stop string, the tokens are kept up to the one that completed it (with their logprobs),
and a completion without one is left as it is."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from trajflow.rl.stops import cut_at_stop


def completion(tokenizer, text: str) -> tuple[list[int], list[float], str]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids, [-0.1 * (i + 1) for i in range(len(ids))], tokenizer.decode(ids, skip_special_tokens=True)


def test_the_answer_ends_before_the_first_stop_and_keeps_the_tokens_that_made_it(tiny_model: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model)
    ids, logprobs, text = completion(tok, "Thought: list the files\nAction: ls\nObservation: a.txt b.txt")
    cut = cut_at_stop(tok, ids, logprobs, text, ["Observation:", "Action:"])
    assert cut is not None
    kept, kept_logprobs, answer = cut
    assert answer == "Thought: list the files\n", "the earliest stop string wins, and is not returned"
    assert kept == ids[: len(kept)] and kept_logprobs == logprobs[: len(kept)], "a prefix of what was sampled"
    decoded = tok.decode(kept, skip_special_tokens=True)
    assert decoded.startswith("Thought: list the files\nAction:")
    assert not tok.decode(kept[:-1], skip_special_tokens=True).startswith("Thought: list the files\nAction:")


def test_a_completion_without_a_stop_string_is_left_alone(tiny_model: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model)
    ids, logprobs, text = completion(tok, "just an answer")
    assert cut_at_stop(tok, ids, logprobs, text, ["Observation:"]) is None
    assert cut_at_stop(tok, ids, logprobs, text, [""]) is None  # an empty stop string stops nothing
