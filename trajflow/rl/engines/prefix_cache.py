"""`PrefixCache`: the key/value tensors of earlier sequences (a prompt and what was generated after it), kept so
that a later prompt sharing a prefix with one skips recomputing it.

An agent's turn t+1 prompt is its turn t prompt, the tokens it generated and the environment's reply
(`trajflow.rl.chat` keeps token ids exactly), and every episode of a task starts with the same instructions. Without
this, each turn re-runs the whole conversation through the model (on a CPU, prefill of 32 prompts of 170 tokens took
about 40 s where generating 32 tokens after it took about 5 s).

Entries hold one sequence each: its token ids and, per layer, keys and values of shape (heads, length, head_dim)
on the model's device. `match` finds, for a prompt, the entry sharing the longest prefix with it; the first
`length` positions of that entry's tensors are exactly what a forward pass over that prefix would compute (a causal
model's key/value at position p depends on tokens 0..p only), up to floating-point differences from the batch the
entry was computed in. `add` drops entries the new one extends (a trajectory's previous turn) and then the least
recently used ones beyond `max_bytes`.

The cache belongs to one set of weights: the engine clears it whenever it loads another policy version.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count

import torch

LayerKV = tuple[torch.Tensor, torch.Tensor]
"""One layer's keys and values, each (heads, length, head_dim)."""


@dataclass
class Entry:
    tokens: list[int]
    layers: list[LayerKV]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix (binary search on slice equality, which runs in C)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 1:  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixCache:
    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive (an engine without a prefix cache passes none)")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, Entry] = OrderedDict()
        self._ids = count()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def match(self, prompt: list[int], limit: int) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with `prompt`, and that length capped at `limit` (0: none)."""
        best: tuple[int, int] = (-1, 0)
        for key, entry in self._entries.items():
            n = min(common_prefix(entry.tokens, prompt), limit)
            if n > best[1]:
                best = (key, n)
        if best[1] == 0:
            return None, 0
        self._entries.move_to_end(best[0])
        return self._entries[best[0]], best[1]

    def add(self, tokens: list[int], layers: list[LayerKV]) -> None:
        """Keep `layers` (each tensor's length == len(tokens)) for `tokens`; drops the entries it extends, then
        the least recently used while over budget (the new entry too, if it alone is over)."""
        for key in [k for k, e in self._entries.items() if tokens[: len(e.tokens)] == e.tokens]:
            self.nbytes -= self._entries.pop(key).nbytes
        entry = Entry(tokens, layers)
        self._entries[next(self._ids)] = entry
        self.nbytes += entry.nbytes
        while self.nbytes > self.max_bytes and self._entries:
            self.nbytes -= self._entries.popitem(last=False)[1].nbytes


def batch_past(cache: PrefixCache, prompts: Sequence[list[int]], width: int) -> tuple[list[LayerKV] | None, int]:
    """Keys and values, per layer (batch, heads, width - S, head_dim), for a batch of `prompts` left-padded to
    `width`, S the longest part of any prompt the cache lacks; and how many prompt tokens they cover. (None, 0)
    when nothing is reused. Row r takes its cached keys and values for its positions before the last S (zeros,
    masked, where the padding is): rows that reuse less recompute a few cached tokens, and the layout stays plain
    left padding, which `generate` handles with any model."""
    if not len(cache):
        return None, 0
    matches = [cache.match(p, limit=len(p) - 1) for p in prompts]
    fresh = max(len(p) - n for p, (_, n) in zip(prompts, matches, strict=True))
    cached = width - fresh
    if cached <= 0:
        return None, 0
    sample = next(e for e, _ in matches if e is not None)
    layers = []
    for layer, (k0, v0) in enumerate(sample.layers):
        keys = k0.new_zeros((len(prompts), k0.shape[0], cached, k0.shape[2]))
        values = v0.new_zeros((len(prompts), v0.shape[0], cached, v0.shape[2]))
        for row, (prompt, (entry, _)) in enumerate(zip(prompts, matches, strict=True)):
            take = len(prompt) - fresh
            if take > 0:
                assert entry is not None  # it shares at least len(prompt) - fresh tokens
                k, v = entry.layers[layer]
                keys[row, :, cached - take :] = k[:, :take]
                values[row, :, cached - take :] = v[:, :take]
        layers.append((keys, values))
    return layers, sum(max(len(p) - fresh, 0) for p in prompts)


def keep_batch(
    cache: PrefixCache,
    prompts: Sequence[list[int]],
    completions: Sequence[list[int]],
    layers: list[LayerKV],
    width: int,
) -> None:
    """Add each row's prompt and completion (EOS-trimmed) with its keys and values from a generation's `layers`
    (batch, heads, width + generated - 1, head_dim): the last generated token was never fed back, so it has none."""
    fed = layers[0][0].shape[2] - width
    for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        n = min(len(completion), fed)
        start, end = width - len(prompt), width + n
        kv = [(k[row, :, start:end].clone(), v[row, :, start:end].clone()) for k, v in layers]
        cache.add([*prompt, *completion[:n]], kv)
