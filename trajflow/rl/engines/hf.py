"""`HFEngine`, transformers on torch: many concurrent `generate` calls in, one batched forward pass at a time out.

A background asyncio task collects concurrent requests into batches (up to `max_batch`; once one request waits,
it waits at most `batch_wait_ms` for more) and runs each batch as ONE `model.generate` (left padding + attention
mask) in a worker thread, so the event loop stays free. Requests are grouped by identical `SamplingParams` but
for the seed: the oldest waiting request picks the params of the next batch and later requests with the same
params join it (FIFO within a group, so no group starves). That is static batching: a batch waits for its longest
completion.

`continuous=True` (`[model] batching = "continuous"`) runs `trajflow.rl.engines.continuous` instead: one decode
loop over a shared KV cache, which a request joins at the next step and leaves the step it finishes, rows with any
`SamplingParams` side by side, the same tokens and logprobs per request (see that module for what it leaves out).
Models with sliding-window layers fall back to static batches (logged).

Sampling (`temperature > 0`) is ours, not transformers': `trajflow.rl.engines.sampling.SeededSampler` applies
temperature and top-p and draws each row's token from softmax(logits / T) over the top-p nucleus with one uniform number
from a generator per row, seeded by the request's `SamplingParams.seed` (unseeded requests draw from torch's global
RNG), and leaves only that token for `generate`'s greedy step. So a seeded request draws the same tokens alone or
batched with any others (up to float ties, see that module).

Logprobs: each sampled token's logprob under `log_softmax(logits / temperature)` of the step it was sampled at,
computed on the fly by a logits processor (no vocabulary-sized tensor is kept per step). The processor sees the
logits after transformers' built-in processors (e.g. a repetition penalty a foreign checkpoint's generation config
asks for; our checkpoints ask for none) and before the sampler's temperature, top-p and noise. With `top_p < 1`
the value is the untruncated distribution's. Greedy (`temperature == 0`) reports the T=1 logprob. Precision
follows the weights: float32 matches a teacher-forced forward pass to ~1e-6; with bfloat16 weights (SmolLM2's
checkpoint dtype; faster only where the hardware has native bf16, see `trajflow.rl.precision`) the batched, left-padded,
KV-cached decode and a teacher-forced pass differed by up to ~0.2 nats per token (mean ~0.04) when measured; pass
`dtype=torch.float32` where that matters. `trajflow.rl.engines.load` picks the dtype.

Completions keep the EOS token when one was sampled (finish_reason "stop"; training must see the model stop)
and drop everything after it; "length" when `max_new_tokens` ran out. `text` is decoded without special tokens.

Devices: the model and each batch's inputs live on `device` (a GPU or the CPU); token ids and logprobs come back
as CPU lists.

Limits: one batch runs at a time per engine; a request already inside a running batch cannot be interrupted
(cancelling it only discards its result); unseeded requests draw from torch's global RNG, so their outputs are
not reproducible across runs (seeded ones are, on the same weights and the same kind of device).

Weights: with a `WeightSource`, each request names a policy (a training run id; "" is the initial model).
Batches never mix policies. Right before a batch runs, in the same worker thread that runs batches (so never
during one), the engine asks the source for the newest version of the batch's policy and, if it differs from
what is loaded, copies it into the model in place (`trajflow.rl.weights.apply_weights`). Every completion carries
the version that generated it. Switching to a policy whose weights no slot holds reloads; with two weight slots
(`weight_slots`, `trajflow.rl.engines.slots`) a version an eval pins and the one training follows each keep their own.

Prefix cache (`prefix_cache_bytes` > 0, `trajflow.rl.engines.prefix_cache`): each batch's prompts and completions keep
their keys and values, and a later prompt that extends one (a trajectory's next turn; another episode's identical
instructions) is fed to the model only from where it differs. Completions are the ones the engine gives without
it (float32: logprobs within ~1e-5). Cleared whenever other weights are loaded into its slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import torch

from trajflow.contracts.trajectory import SamplingParams
from trajflow.rl.engines.base import Completion, WeightSource, config_positions, eos_ids, trim_at_eos
from trajflow.rl.engines.batches import EngineStats, Request, left_padded
from trajflow.rl.engines.prefix_cache import PrefixCache, batch_past, keep_batch
from trajflow.rl.engines.sampling import LogprobRecorder, SeededSampler
from trajflow.rl.engines.slots import Slot, WeightSlots, auto_capacity

_log = logging.getLogger(__name__)


class HFEngine:
    """transformers + torch, with request batching; see the module docstring."""

    def __init__(
        self,
        model_path: Path,
        *,
        max_batch: int = 32,
        batch_wait_ms: float = 10.0,
        device: str = "cpu",
        torch_threads: int | None = None,
        dtype: torch.dtype | None = None,
        weights: WeightSource | None = None,
        prefix_cache_bytes: int = 0,
        continuous: bool = False,
        interrupt_on_update: bool = False,
        weight_slots: int | None = None,
    ) -> None:
        """`device` a torch device (`cpu`, `cuda`, `cuda:N`; `trajflow.rl.devices.resolve_device` turns a setting such
        as `auto` into one); `dtype` None keeps the checkpoint's dtype (bfloat16 for SmolLM2, float32 for the tiny
        model); `weights` None serves the initial model only; `prefix_cache_bytes` > 0 keeps up to that many bytes of
        keys and values of earlier prompts and completions (`trajflow.rl.engines.prefix_cache`; 0: none); `continuous`
        batches continuously (see the module docstring); `interrupt_on_update` (continuous only)
        moves running generations to a newly published version instead of letting them finish on theirs;
        `weight_slots` how many policies' weights are held at once (None: auto, see `trajflow.rl.engines.slots`)."""
        from transformers import AutoConfig, AutoTokenizer

        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if interrupt_on_update and not continuous:
            raise ValueError("interrupt_on_update needs continuous batching")
        self.model_path = Path(model_path)
        self.name = self.model_path.name
        self.max_positions = config_positions(AutoConfig.from_pretrained(self.model_path))
        self.version = 0
        self.policy = ""
        """The policy whose weights are loaded ("" = the initial model)."""
        self.weights = weights
        self.follows_training = weights is not None
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_ms / 1000.0
        self.device = torch.device(device)
        self.torch_threads = torch_threads
        self.dtype = dtype
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.model: Any = None
        self._eos: list[int] = eos_ids(self.tokenizer)
        self._pad_id: int = self._pick_pad_id()
        self._pending: list[Request] = []
        self._running: list[Request] = []
        self._wakeup = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        self._stats = EngineStats()
        self.continuous = continuous
        self.interrupt_on_update = interrupt_on_update
        self.prefix_cache = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self._slot_count = weight_slots
        self.slots = WeightSlots(weight_slots or 1, prefix_cache_bytes)
        """The weights held besides the running ones (`self.model`); sized when the model is loaded."""

    def _pick_pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad) if pad is not None else self._eos[0]

    async def start(self) -> None:
        """Load the model (in the worker thread) and start the batching loop. Idempotent."""
        if self.model is None:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._load_model)
        if self._loop_task is None or self._loop_task.done():
            self._wakeup = asyncio.Event()
            from trajflow.rl.engines.continuous import continuous_loop

            scheduler = continuous_loop(self) if self.continuous else self._batch_loop()
            self._loop_task = asyncio.create_task(scheduler, name=f"hf-engine-{self.name}")

    def _load_model(self) -> None:
        from transformers import AutoModelForCausalLM

        if self.torch_threads is not None:
            torch.set_num_threads(self.torch_threads)
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=self.dtype or "auto")
        # an upcast to the base class: typeshed's functools.wraps result, which transformers' .to is, does not bind self
        cast(torch.nn.Module, model).to(self.device).eval()
        self._eos = eos_ids(self.tokenizer, model.config)
        if "sliding_attention" in (getattr(model.config, "layer_types", None) or []):
            self.prefix_cache = None  # a sliding-window layer keeps only its window: no prefix to reuse
            if self.continuous:  # its cache layers cannot be left-padded and merged as full ones are
                _log.warning("%s has sliding-window layers: static batches instead of continuous", self.name)
                self.continuous = False
        self.model = model
        self.slots.capacity = self._slot_count or auto_capacity(model, self.device)

    async def close(self) -> None:
        """Stop the loop, fail waiting requests, release the thread. The engine cannot be restarted after it."""
        stranded = [*self._pending, *self._running]  # snapshot: cancelling the loop clears `_running`
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        for request in [*stranded, *self._pending]:
            if not request.future.done():
                request.future.set_exception(RuntimeError("engine closed"))
        self._pending.clear()
        self._running = []
        self._executor.shutdown(wait=True)

    def stats(self) -> dict[str, float]:
        return self._stats.as_dict()

    def available_version(self, policy: str) -> int:
        return self.weights.latest_version(policy) if self.weights is not None and policy else 0

    async def generate(self, prompt_ids: list[int], params: SamplingParams, policy: str = "") -> Completion:
        """Queue one request and wait for its completion; cancelling while queued drops it from the queue."""
        if self._loop_task is None or self._loop_task.done():
            raise RuntimeError("HFEngine.generate called before start() (or after close())")
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        request = Request(list(prompt_ids), params, future, policy)
        self._pending.append(request)
        self._stats.requests += 1
        self._wakeup.set()
        try:
            return await future
        except asyncio.CancelledError:
            if request in self._pending:
                self._pending.remove(request)
            raise

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            await self._wait_for_more()
            batch = self._take_batch()
            if not batch:
                continue
            started = time.monotonic()
            self._running = batch
            try:
                results = await loop.run_in_executor(
                    self._executor,
                    self._run_batch,
                    [r.prompt_ids for r in batch],
                    batch[0].params.unseeded(),
                    batch[0].policy,
                    [r.params.seed for r in batch],
                )
            except Exception as error:  # a failed batch fails its requests, never the loop
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(error)
                continue
            finally:
                self._running = []
            self._record(batch, results, started, time.monotonic() - started)

    async def _wait_for_more(self) -> None:
        """Once a request waits, give others up to batch_wait_ms to join (or until a batch is full)."""
        if not self._pending:
            return
        deadline = self._pending[0].enqueued + self.batch_wait_s
        while self._pending and len(self._pending) < self.max_batch:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout=remaining)

    def _take_batch(self) -> list[Request]:
        live = [r for r in self._pending if not r.future.done()]
        if not live:
            self._pending.clear()
            return []
        params, policy = live[0].params.unseeded(), live[0].policy
        batch = [r for r in live if r.params.unseeded() == params and r.policy == policy][: self.max_batch]
        taken = {id(r) for r in batch}
        self._pending = [r for r in live if id(r) not in taken]
        return batch

    def _record(self, batch: list[Request], results: list[Completion], started: float, seconds: float) -> None:
        self._stats.batches += 1
        self._stats.batched_requests += len(batch)
        self._stats.busy_s += seconds
        tokens = sum(len(c.token_ids) for c in results)
        for request, completion in zip(batch, results, strict=True):
            self._stats.completion_tokens += len(completion.token_ids)
            completion.batch_requests = len(batch)
            completion.queue_wait_s = max(0.0, started - request.enqueued)
            completion.batch_tokens_per_s = tokens / seconds if seconds > 0 else None
            if not request.future.done():  # a cancelled caller just drops its result
                request.future.set_result(completion)

    def _use_policy(self, policy: str) -> None:
        """Load the newest weights of `policy` if they are not what is loaded (runs in the worker thread)."""
        if self.weights is None:
            return
        newest = self.weights.latest(policy) if policy else None
        want = (newest.policy, newest.version) if newest else ("", 0)
        if want == (self.policy, self.version):
            return
        running = Slot(self.model, self.policy, self.version, self.prefix_cache)
        slot, load = self.slots.take(running, want)
        if load:
            from trajflow.rl.weights import apply_weights

            apply_weights(slot.model, newest.path if newest else self.model_path)
            slot.policy, slot.version = want
            self._stats.weight_loads += 1
            if slot.prefix_cache is not None:
                slot.prefix_cache.clear()  # computed with the weights just replaced
        else:
            self._stats.slot_switches += 1
        self.model, self.policy, self.version, self.prefix_cache = (
            slot.model,
            slot.policy,
            slot.version,
            slot.prefix_cache,
        )

    def _run_batch(
        self,
        prompts: Sequence[list[int]],
        params: SamplingParams,
        policy: str = "",
        seeds: Sequence[int | None] | None = None,
    ) -> list[Completion]:
        """One batched `model.generate` (runs in the worker thread); `seeds` one per prompt (None: unseeded)."""
        self._use_policy(policy)
        version = self.version
        input_ids, attention = left_padded(prompts, self._pad_id)
        width = input_ids.shape[1]
        past = self._reused_prefix(prompts, width)
        recorder = LogprobRecorder(prompt_len=width, temperature=params.temperature)
        processors: list[Any] = [recorder]
        if params.temperature > 0.0:  # after the recorder: it must see the logits before temperature and noise
            row_seeds = list(seeds) if seeds is not None else [None] * len(prompts)
            processors.append(SeededSampler(row_seeds, params.temperature, params.top_p, self.device))
        with torch.inference_mode():
            # greedy: the argmax of the sampler's perturbed scores when sampling, of the logits otherwise
            output = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention.to(self.device),
                logits_processor=processors,
                max_new_tokens=params.max_new_tokens,
                eos_token_id=self._eos,
                pad_token_id=self._pad_id,
                do_sample=False,
                past_key_values=past,
                return_dict_in_generate=True,
            )
        sequences = output.sequences
        # the logprobs are gathered on the model's device; both come back to CPU lists
        logprobs = recorder.finish(sequences[:, width:]).cpu()
        generated = sequences[:, width:].cpu()
        eos = set(self._eos)
        completions = []
        for row in range(len(prompts)):
            ids, lps, reason = trim_at_eos(generated[row].tolist(), logprobs[row].tolist(), eos)
            text = str(self.tokenizer.decode(ids, skip_special_tokens=True))
            completions.append(Completion(ids, lps, text, reason, version))
        self._stats.prompt_tokens += sum(len(p) for p in prompts)
        if self.prefix_cache is not None:
            self._keep(prompts, completions, output.past_key_values, width)
        return completions

    def _reused_prefix(self, prompts: Sequence[list[int]], width: int) -> Any:
        """The batch's `DynamicCache` from the prefix cache (`prefix_cache.batch_past`); None: nothing reused."""
        if self.prefix_cache is None:
            return None
        layers, reused = batch_past(self.prefix_cache, prompts, width)
        if layers is None:
            return None
        from transformers import DynamicCache

        self._stats.reused_tokens += reused
        return DynamicCache(ddp_cache_data=layers, config=self.model.config)

    def _keep(self, prompts: Sequence[list[int]], completions: list[Completion], cache: Any, width: int) -> None:
        assert self.prefix_cache is not None
        layers = [(k, v) for k, v, *_ in cache]
        keep_batch(self.prefix_cache, prompts, [c.token_ids for c in completions], layers, width)
