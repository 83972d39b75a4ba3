"""Stop sequences of an agent's request (`GenerateInput.stop`), applied to a completion after it is sampled, the
same for every engine: the answer ends before the first stop string (OpenAI's semantics: the stop string is not
returned), and the turn keeps the sampled tokens up to the one that completed it, with their logprobs. The tokens
sampled after it are dropped: the policy never saw them as part of its context, so they are neither returned nor
trained on. Limits: the engine still spends its `max_new_tokens` (it is not told to stop early).
"""

from __future__ import annotations

from typing import Any


def cut_at_stop(
    tokenizer: Any, token_ids: list[int], logprobs: list[float], text: str, stops: list[str]
) -> tuple[list[int], list[float], str] | None:
    """(token ids, logprobs, text) of a completion ended at the first of `stops` in `text`; None when none occurs.
    `text` is the completion's decoded text (`tokenizer.decode(token_ids, skip_special_tokens=True)`)."""
    found = [(i, s) for s in stops if s and (i := text.find(s)) >= 0]
    if not found:
        return None
    at, stop = min(found)
    through = text[: at + len(stop)]
    for k in range(1, len(token_ids) + 1):  # the shortest prefix of the sampled tokens that holds the stop string
        if tokenizer.decode(token_ids[:k], skip_special_tokens=True).startswith(through):
            return token_ids[:k], logprobs[:k], text[:at]
    return list(token_ids), list(logprobs), text[:at]  # decoding is not prefix-stable here: keep every token
