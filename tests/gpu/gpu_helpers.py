"""Checks the GPU tests share: decode rounds of an engine, whichever it is."""

from __future__ import annotations

import math
from typing import Any


def checked_rounds(rounds: list, batches: list[int], new_tokens: int) -> list[dict[str, Any]]:
    """Check decode rounds (`trajflow.lab.bench.gpu_check.decode_rounds`: each round's figures and completions): one
    round a batch size, every completion a token and a finite logprob (<= 0) per generated token, at most `new_tokens`,
    the round's token count theirs. Returns each round's figures as rows."""
    assert [r.batch for r, _ in rounds] == batches
    for r, completions in rounds:
        assert len(completions) == r.batch
        for c in completions:
            assert 0 < len(c.token_ids) == len(c.logprobs) <= new_tokens
            assert all(math.isfinite(x) and x <= 0.0 for x in c.logprobs), c.logprobs
        assert r.tokens == sum(len(c.token_ids) for c in completions) and r.tokens_per_s > 0
    return [
        {"batch": r.batch, "tokens": r.tokens, "seconds": r.seconds, "tokens_per_s": r.tokens_per_s} for r, _ in rounds
    ]
