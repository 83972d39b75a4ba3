"""Continuous batching for `HFEngine(continuous=True)` (`[model] batching = "continuous"`): requests join the running
batch at its next decode step and leave it the step they finish.

`DecodeBatch` (worker thread only) holds the running rows and ONE batched KV cache (a transformers `DynamicCache`,
rows left-padded to a common length, an explicit attention mask, per-row position ids). A step:

1. drops rows whose caller went away (a cancelled request);
2. runs one decode forward pass over every running row (its last sampled token in, one new token out);
3. prefills the requests admitted this step (together, left-padded, as `generate` would), samples their first token
   and merges their cache into the batch's (the shorter side padded on the left);
4. removes the rows that finished (EOS sampled: "stop", kept; their own `max_new_tokens` reached: "length"), trims
   cache columns no row uses any more, and returns their completions.

`continuous_loop` (the engine's asyncio task) admits requests between steps: while rows run, every waiting request
of the same policy joins at the next step (up to `max_batch` rows, FIFO; a request of another policy stops admission
until the batch drains, so it cannot starve); an empty batch waits `batch_wait_ms` for company as static mode does.
A finished row's future resolves when its step returns. In this mode the engine's `batches` stat counts steps
(`mean_batch_size`: rows per step), and a completion's `batch_requests` is the most rows it shared a step with,
`queue_wait_s` its wait before its prefill, `batch_tokens_per_s` all rows' tokens per busy second while it ran.

Sampling and logprobs are the static path's, per row: each row keeps its own `SamplingParams` (temperature, top_p,
max_new_tokens, seed), a seeded row draws from its own generator with `trajflow.rl.engines.sampling.draw_tokens`
(one uniform number per step, as `SeededSampler` does: the same tokens alone, batched statically or here, up to
float ties), greedy rows take the argmax; the logprob is log_softmax(logits / T) of the sampled token (T = 1 when
greedy). Unlike `generate`, no processor of the checkpoint's generation config (e.g. a repetition penalty) runs; ours
ask for none.

Weights: one policy runs at a time. The batch's policy version is checked after each step; when a newer one is
published the batch stops admitting, its rows finish on the weights they started on, and the next request reloads
(`HFEngine._use_policy`) before it is prefilled: every completion comes from one version. With
`interrupt_on_update` (`[model] interrupt_on_update`) the engine instead loads the new version in place right away,
between two steps, and the running rows continue on it: their tokens from then on are the new weights' choices and
logprobs, but the keys and values already cached for their prompt and earlier tokens stay the old weights' (not
recomputed), so such a completion is not exactly what either version alone would generate. It records the versions
it spans (`Completion.versions`) and reports the oldest as its `policy_version`, which staleness counts from.

Prefix cache (`trajflow.rl.engines.prefix_cache`, as in static mode): a prefill takes the cached keys and values of
its prompts' longest cached prefixes (`batch_past`) and feeds the model only the rest; a finished row gives its
prompt and completion's keys and values (the rightmost columns of its row of the batch's cache) to the cache, unless
it spans two versions (`interrupt_on_update`). Cleared whenever other weights are loaded.

Not here (yet): models with sliding-window layers (the engine falls back to static batches for them); one ragged
forward pass for a step's prefill and decode (they are two).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from trajflow.rl.engines.base import Completion
from trajflow.rl.engines.batches import Request, left_padded
from trajflow.rl.engines.prefix_cache import batch_past
from trajflow.rl.engines.sampling import draw_tokens, row_generator, uniform

if TYPE_CHECKING:
    from trajflow.rl.engines.hf import HFEngine


@dataclass(eq=False)
class Row:
    """One running request: what it generated so far and where it stands in the engine's counters."""

    request: Request
    generator: torch.Generator | None
    admitted: float
    tokens_before: int
    """The engine's decode tokens when it was admitted (for its completion's `batch_tokens_per_s`)."""
    busy_before: float
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    widest: int = 0
    """The most rows that shared a step with it."""
    versions: list[int] = field(default_factory=list)
    """The policy versions it was generated with, oldest first (more than one only with `interrupt_on_update`)."""

    def done(self, eos: set[int]) -> bool:
        return self.tokens[-1] in eos or len(self.tokens) >= self.request.params.max_new_tokens


def sample_rows(logits: torch.Tensor, rows: list[Row]) -> tuple[list[int], list[float]]:
    """One token and its logprob per row of float32 `logits` (rows, vocab), each under its row's params."""
    tokens = torch.empty(len(rows), dtype=torch.long, device=logits.device)
    groups: dict[tuple[float, float], list[int]] = {}
    for i, row in enumerate(rows):
        params = row.request.params
        groups.setdefault((params.temperature, params.top_p), []).append(i)
    logprobs = torch.empty(len(rows), dtype=torch.float32, device=logits.device)
    for (temperature, top_p), members in groups.items():
        index = torch.tensor(members, device=logits.device)
        z = logits.index_select(0, index) / (temperature if temperature > 0 else 1.0)
        if temperature > 0:
            u = torch.stack([uniform(rows[i].generator, logits.device) for i in members])
            drawn = draw_tokens(z, u, top_p)
        else:
            drawn = z.argmax(dim=-1)
        tokens[index] = drawn
        logprobs[index] = torch.log_softmax(z, dim=-1).gather(1, drawn[:, None]).squeeze(1)
    return tokens.tolist(), logprobs.tolist()


@dataclass
class StepResult:
    finished: list[tuple[Row, Completion]]
    stale: bool
    """A newer version of the running policy is published: admit nothing more until the batch drains."""
    admission_error: Exception | None = None
    """Why the prefill of this step's admitted requests failed (they fail; the running rows went on)."""


class DecodeBatch:
    """The running rows and their shared KV cache; every method runs in the engine's worker thread."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine = engine
        self.rows: list[Row] = []
        self.cache: Any = None
        self.mask = torch.zeros((0, 0), dtype=torch.long)
        self.positions = torch.zeros(0, dtype=torch.long)
        """Each row's next position id (its prompt and generated tokens so far)."""
        self.stale = False

    @property
    def policy(self) -> str | None:
        return self.rows[0].request.policy if self.rows else None

    def clear(self) -> None:
        self.rows, self.cache, self.stale = [], None, False

    def step(self, admit: list[Request], drop: list[Row]) -> StepResult:
        started = time.monotonic()
        engine = self.engine
        with torch.inference_mode():
            if drop:
                dropped = {id(row) for row in drop}
                self._keep([i for i, row in enumerate(self.rows) if id(row) not in dropped])
            generated = self._decode() if self.rows else 0
            admission_error = None
            if admit and not self.rows:  # nothing else runs: a failure here fails the step's requests, all admitted
                engine._use_policy(admit[0].policy)
                generated += self._prefill(admit)
            elif admit:
                try:  # the running rows' state is only changed by the prefill's last act, the merge
                    generated += self._prefill(admit)
                except Exception as error:  # e.g. a prompt the model cannot take: those requests fail, not the rows
                    admission_error = error
            for row in self.rows:
                row.widest = max(row.widest, len(self.rows))
            stats = engine._stats
            stats.batches += 1
            stats.batched_requests += len(self.rows)
            stats.completion_tokens += generated
            stats.busy_s += time.monotonic() - started
            finished = self._finish()
        self._check_version()
        return StepResult(finished, self.stale, admission_error)

    def _check_version(self) -> None:
        """Is a newer version of the running policy published? Then stop admitting until the batch drains, or,
        with `interrupt_on_update`, load it now and let the running rows go on with it."""
        engine, policy = self.engine, self.policy
        if not policy or engine.weights is None:  # `latest_version`: a cached pointer, cheap when nothing changed
            self.stale = False
        elif not engine.interrupt_on_update:
            self.stale = engine.weights.latest_version(policy) > engine.version
        elif engine.weights.latest_version(policy) > engine.version:
            engine._use_policy(policy)  # in place, between two steps: the rows' cached keys/values stay the old ones
            for row in self.rows:
                if row.versions[-1] != engine.version:
                    row.versions.append(engine.version)

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any) -> Any:
        device = self.engine.device
        return self.engine.model(
            input_ids=input_ids.to(device),
            attention_mask=mask.to(device),
            position_ids=positions.to(device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )

    def _decode(self) -> int:
        last = torch.tensor([row.tokens[-1] for row in self.rows], dtype=torch.long)
        self.mask = torch.cat([self.mask, torch.ones((len(self.rows), 1), dtype=torch.long)], dim=1)
        output = self._forward(last[:, None], self.mask, self.positions[:, None], self.cache)
        self.cache = output.past_key_values
        self.positions = self.positions + 1
        self._append(output.logits[:, -1].float(), self.rows)
        return len(self.rows)

    def _prefill(self, admit: list[Request]) -> int:
        from transformers import DynamicCache

        engine = self.engine
        input_ids, mask = left_padded([r.prompt_ids for r in admit], engine._pad_id)
        width = input_ids.shape[1]
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # what `generate` gives left-padded rows
        past, reused = None, 0
        if engine.prefix_cache is not None:
            past, reused = batch_past(engine.prefix_cache, [r.prompt_ids for r in admit], width)
        cached = 0 if past is None else past[0][0].shape[2]  # columns whose keys/values came from the prefix cache
        cache = DynamicCache(ddp_cache_data=past, config=engine.model.config)
        output = self._forward(input_ids[:, cached:], mask, positions[:, cached:], cache)
        now, stats = time.monotonic(), engine._stats
        rows = [
            Row(r, row_generator(r.params.seed, engine.device), now, stats.completion_tokens, stats.busy_s)
            for r in admit
        ]
        for row in rows:
            row.versions.append(engine.version)
        self._append(output.logits[:, -1].float(), rows)
        stats.prompt_tokens += sum(len(r.prompt_ids) for r in admit)
        stats.reused_tokens += reused
        self._merge(rows, output.past_key_values, mask, positions[:, -1] + 1)
        return len(rows)

    def _append(self, logits: torch.Tensor, rows: list[Row]) -> None:
        tokens, logprobs = sample_rows(logits, rows)
        for row, token, logprob in zip(rows, tokens, logprobs, strict=True):
            row.tokens.append(token)
            row.logprobs.append(logprob)

    def _merge(self, rows: list[Row], cache: Any, mask: torch.Tensor, positions: torch.Tensor) -> None:
        if not self.rows:
            self.rows, self.cache, self.mask, self.positions = rows, cache, mask, positions
            return
        width = max(self.mask.shape[1], mask.shape[1])
        for old, new in zip(self.cache.layers, cache.layers, strict=True):
            old.keys = torch.cat([_left_pad(old.keys, width, 2), _left_pad(new.keys, width, 2)])
            old.values = torch.cat([_left_pad(old.values, width, 2), _left_pad(new.values, width, 2)])
        self.mask = torch.cat([_left_pad(self.mask, width, 1), _left_pad(mask, width, 1)])
        self.positions = torch.cat([self.positions, positions])
        self.rows = [*self.rows, *rows]

    def _keep(self, keep: list[int]) -> None:
        """Keep only the rows at `keep` (in order), and drop the cache columns none of them uses."""
        if not keep:
            self.clear()
            return
        self.rows = [self.rows[i] for i in keep]
        index = torch.tensor(keep, dtype=torch.long)
        self.mask = self.mask.index_select(0, index)
        self.positions = self.positions.index_select(0, index)
        used = self.mask.any(dim=0).nonzero()
        start = int(used[0]) if used.numel() else 0
        self.mask = self.mask[:, start:]
        on_device = index.to(self.engine.device)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, on_device)[:, :, start:]
            layer.values = layer.values.index_select(0, on_device)[:, :, start:]

    def _finish(self) -> list[tuple[Row, Completion]]:
        eos = set(self.engine._eos)
        done = [row.done(eos) for row in self.rows]
        if not any(done):
            return []
        finished = []
        for i, (row, is_done) in enumerate(zip(self.rows, done, strict=True)):
            if is_done:
                self._keep_prefix(i)
                reason = "stop" if row.tokens[-1] in eos else "length"
                text = str(self.engine.tokenizer.decode(row.tokens, skip_special_tokens=True))
                spans = row.versions if len(row.versions) > 1 else []
                finished.append((row, Completion(row.tokens, row.logprobs, text, reason, row.versions[0], spans)))
        self._keep([i for i, is_done in enumerate(done) if not is_done])
        return finished

    def _keep_prefix(self, i: int) -> None:
        """Give row `i`'s prompt and fed tokens (all but the last sampled) to the prefix cache, when it has one and
        they came from the loaded weights alone. A row's tokens are the rightmost columns of the batch's cache."""
        row, cache = self.rows[i], self.engine.prefix_cache
        if cache is None or row.versions != [self.engine.version]:
            return
        tokens = [*row.request.prompt_ids, *row.tokens[:-1]]
        layers = [
            (layer.keys[i, :, -len(tokens) :].clone(), layer.values[i, :, -len(tokens) :].clone())
            for layer in self.cache.layers
        ]
        cache.add(tokens, layers)


def _left_pad(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """`tensor` with zeros prepended along `dim` up to `width` (a cache's length dim 2, a mask's dim 1)."""
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    pad = [0, 0] * (tensor.dim() - 1 - dim) + [missing, 0]
    return F.pad(tensor, pad)


def _admissions(engine: HFEngine, batch: DecodeBatch) -> list[Request]:
    """The waiting requests that join the batch at its next step (FIFO, same policy, up to `max_batch` rows)."""
    live = [r for r in engine._pending if not r.future.done()]
    if batch.stale:
        engine._pending = live
        return []
    policy = batch.policy if batch.rows else (live[0].policy if live else None)
    room = engine.max_batch - len(batch.rows)
    admit: list[Request] = []
    for request in live:
        if request.policy != policy or len(admit) == room:
            break  # another policy's request waits for this batch to drain
        admit.append(request)
    engine._pending = live[len(admit) :]
    return admit


async def continuous_loop(engine: HFEngine) -> None:
    """The engine's scheduling task in continuous mode (see the module docstring). A failed prefill fails the
    requests it admitted; any other failed step fails every request of the step and empties the batch; the loop
    goes on."""
    loop = asyncio.get_running_loop()
    batch = DecodeBatch(engine)
    while True:
        if not batch.rows:
            while not engine._pending:
                engine._wakeup.clear()
                await engine._wakeup.wait()
            await engine._wait_for_more()
        drop = [row for row in batch.rows if row.request.future.done()]  # their callers went away
        admit = _admissions(engine, batch)
        if not admit and not batch.rows:
            continue
        engine._running = [*(row.request for row in batch.rows), *admit]
        try:
            result = await loop.run_in_executor(engine._executor, batch.step, admit, drop)
        except Exception as error:  # a failed step fails its requests, never the loop
            for request in engine._running:
                if not request.future.done():
                    request.future.set_exception(error)
            batch.clear()
            engine._running = []
            continue
        if result.admission_error is not None:
            for request in admit:
                if not request.future.done():
                    request.future.set_exception(result.admission_error)
        for row, completion in result.finished:
            completion.batch_requests = row.widest
            completion.queue_wait_s = max(0.0, row.admitted - row.request.enqueued)
            seconds = engine._stats.busy_s - row.busy_before
            tokens = engine._stats.completion_tokens - row.tokens_before
            completion.batch_tokens_per_s = tokens / seconds if seconds > 0 else None
            if not row.request.future.done():  # a cancelled caller just drops its result
                row.request.future.set_result(completion)
        engine._running = [row.request for row in batch.rows]
