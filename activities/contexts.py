"""A trajectory's token context in the object store, written turn by turn as deltas and read back whole.

Each decode turn stores one `TurnDelta` (what the turn added: its prompt tokens, completion ids, logprobs, mask
and version) linked to the turn before's, so the bytes a trajectory writes grow linearly with its turns. Reading a
context walks the links back from its newest delta and applies them in order.

A decode worker keeps the contexts it wrote last in memory (least recently used first out, bounded by their total
tokens), so a trajectory whose turns stay on one worker reads nothing back. A turn that lands on another worker,
or on one that restarted, reads the deltas it lacks from the store: the store, never the cache, is the truth.

Limits: reading an uncached context makes one store read per turn, one after another (a 200-turn trajectory on
S3: 200 small GETs in `trajectory.save`). A context written whole by an older trajflow (a `TurnContext` at the
URI instead of a delta) is still read, as the start of the chain.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from trajflow.contracts.records import TurnContext, TurnDelta
from trajflow.infra.store import ObjectStore

DEFAULT_CACHED_TOKENS = 2_000_000
"""About 200 MB of Python lists: e.g. 250 trajectories of 8k tokens in flight on one decode worker."""


class ContextStore:
    """Loads and saves contexts by URI; thread-safe (decode calls it from worker threads)."""

    def __init__(self, store: ObjectStore, max_cached_tokens: int = DEFAULT_CACHED_TOKENS) -> None:
        self.store = store
        self.max_cached_tokens = max_cached_tokens
        self._cache: OrderedDict[str, TurnContext] = OrderedDict()
        self._cached_tokens = 0
        self._lock = threading.Lock()

    def load(self, uri: str | None) -> TurnContext:
        """The whole context whose newest delta is at `uri` (an empty one for None)."""
        deltas: list[TurnDelta] = []
        ctx = TurnContext()
        while uri is not None:
            cached = self._cached(uri)
            if cached is not None:
                ctx = cached
                break
            data = self.store.get_json(uri)
            if "previous" not in data:  # a whole context, as trajflow wrote them before deltas
                ctx = TurnContext.model_validate(data)
                break
            delta = TurnDelta.model_validate(data)
            deltas.append(delta)
            uri = delta.previous
        for delta in reversed(deltas):
            ctx = delta.apply(ctx)
        return ctx

    def save(self, key: str, previous: str | None, before: TurnContext, after: TurnContext) -> str:
        """Store what `after` adds to `before` (the context at `previous`) under `key`; return its URI."""
        uri = self.store.put_json(key, TurnDelta.between(before, after, previous))
        with self._lock:
            if previous is not None:  # the trajectory goes on from the new context; the old one is not needed here
                self._drop(previous)
            self._put(uri, after)
        return uri

    def _cached(self, uri: str) -> TurnContext | None:
        with self._lock:
            ctx = self._cache.get(uri)
            if ctx is not None:
                self._cache.move_to_end(uri)
            return ctx

    def _put(self, uri: str, ctx: TurnContext) -> None:
        self._drop(uri)
        self._cache[uri] = ctx
        self._cached_tokens += len(ctx.token_ids)
        while self._cached_tokens > self.max_cached_tokens and self._cache:
            self._drop(next(iter(self._cache)))

    def _drop(self, uri: str) -> None:
        ctx = self._cache.pop(uri, None)
        if ctx is not None:
            self._cached_tokens -= len(ctx.token_ids)
