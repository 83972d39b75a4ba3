"""The torch-free half of the generation engines: the `Engine` protocol, what a generation returns
(`Completion`), where an engine finds newer weights (`WeightSource`, `PolicyWeights`), and the errors an engine
that talks to a server raises (`EngineError`: each says whether retrying can help).

Everything here is stdlib + contracts, so `infra/` (the policy store is a `WeightSource`) and the workflows'
neighbours can use these types without importing torch; a unit test imports this module in a fresh interpreter
and checks that torch never loads. The engines themselves live beside it: `trajflow.rl.engines.hf` (transformers on
torch), `trajflow.rl.engines.vllm` (vLLM), `trajflow.rl.engines.openai` (a remote OpenAI-compatible server),
`trajflow.rl.engines.scripted`
(fixed replies, for tests); `trajflow.rl.engines.load` builds one from a `ModelConfig`.

Not here: batching, sampling, logprob computation (each engine's own job).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from trajflow.contracts.engines import PolicyWeights
from trajflow.contracts.trajectory import SamplingParams


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    """"stop" when EOS was generated, "length" when max_new_tokens ran out."""
    policy_version: int = 0
    """The version of the weights that generated this completion (0: the initial model); the oldest one when several
    did (`versions`), so staleness is counted from where it started."""
    versions: list[int] = field(default_factory=list)
    """Every version that generated part of it, oldest first, when more than one did (`HFEngine` with
    `interrupt_on_update` moves running generations to new weights); empty: `policy_version` alone."""
    batch_requests: int = 0
    """How many requests the engine's batch held (0: the engine does not say, e.g. a server's)."""
    queue_wait_s: float | None = None
    """Seconds the request waited before its batch started (None: the engine does not say)."""
    batch_tokens_per_s: float | None = None
    """Tokens the whole batch generated per second of its run (None: the engine does not say)."""


class EngineError(Exception):
    """A generation failed outside the engine's own process (a remote server). `retryable`: may the same request
    succeed later? The decode activity maps each type to its own error type once (`trajflow.activities.decode`)."""

    retryable: ClassVar[bool] = False


class EngineUnavailable(EngineError):
    """The server could not be reached or answered in time, or failed on its side (5xx, 408, 429). Retryable."""

    retryable = True


class EngineRequestRejected(EngineError):
    """The server refused this request as wrong (400, 413, 422: e.g. a prompt longer than its context). The
    trajectory's fault, not the infrastructure's: not retryable."""


class EngineMisconfigured(EngineError):
    """The server cannot serve this engine as configured: unauthorised, an unknown model or endpoint, an answer
    without the token ids or logprobs asked for, a tokenizer that is not the served model's. Not retryable, and
    not the trajectory's fault."""


@runtime_checkable
class WeightSource(Protocol):
    """Where an engine finds the newest weights of a policy. Called between batches, so it must be cheap when
    nothing changed (cache the pointer, download each version once)."""

    def latest(self, policy: str) -> PolicyWeights | None:
        """The newest published weights of `policy`, or None when it has none yet (the initial model serves)."""
        ...

    def latest_version(self, policy: str) -> int:
        """The newest published version of `policy` (0 when none), without downloading anything."""
        ...


@runtime_checkable
class Engine(Protocol):
    tokenizer: Any
    version: int
    """Policy version of the loaded weights (0 for the initial model)."""
    name: str

    @property
    def follows_training(self) -> bool:
        """Whether the engine loads each version a training run publishes (from its `WeightSource`). False for a
        frozen policy (a remote server's, or an engine without weights): a training run on its pool is refused at
        its start (`trajflow.workflows.preflight`), since its requests would wait for versions it never reaches."""
        ...

    @property
    def max_positions(self) -> int | None:
        """The most tokens, prompt and completion together, one sequence may hold (the model's positions, or the
        server's context length); None when unknown. The decode activity keeps each turn within it."""
        ...

    async def start(self) -> None: ...

    async def generate(self, prompt_ids: list[int], params: SamplingParams, policy: str = "") -> Completion:
        """Generate one completion with the newest weights of `policy` (a training run id; "" for the initial
        model). The completion carries the version that produced it."""
        ...

    def available_version(self, policy: str) -> int:
        """The newest version of `policy` this engine could serve now (0 when none is published)."""
        ...

    async def close(self) -> None: ...

    def stats(self) -> dict[str, float]: ...


def config_positions(model_config: Any) -> int | None:
    """A transformers model config's positions (`max_position_embeddings`), None when it does not say."""
    positions = getattr(model_config, "max_position_embeddings", None)
    return positions if isinstance(positions, int) and positions > 0 else None


def eos_ids(tokenizer: Any, model_config: Any = None) -> list[int]:
    """The EOS token ids of a tokenizer (and of a model config, which may add more), sorted."""
    ids: set[int] = set()
    for source in (tokenizer.eos_token_id, getattr(model_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, list):
            ids.update(int(x) for x in source)
    if not ids:
        raise ValueError("the tokenizer defines no EOS token; the engine cannot tell when a completion ends")
    return sorted(ids)


def trim_at_eos(ids: list[int], logprobs: list[float], eos: set[int]) -> tuple[list[int], list[float], str]:
    """Cut a generation after its first EOS (kept: training must see the model stop); "stop" or "length"."""
    for i, tok in enumerate(ids):
        if tok in eos:
            return ids[: i + 1], logprobs[: i + 1], "stop"
    return ids, logprobs, "length"
