"""`ScriptedEngine`: the `Engine` protocol with fixed replies instead of a model, for testing the code around an
engine (workflows, activities, the training loop's version bookkeeping) without torch doing any work.

Limits: logprobs are all 0.0 and nothing is learned; completions are stamped with the newest version the
`WeightSource` publishes, but no weights are loaded (the script is the policy).
"""

from __future__ import annotations

from typing import Any

from trajflow.contracts.trajectory import SamplingParams
from trajflow.rl.engines.base import Completion, WeightSource, eos_ids


class ScriptedEngine:
    """Returns fixed text (cycling through a list, one entry per call), tokenized and ended with EOS."""

    def __init__(
        self, tokenizer: Any, script: str | list[str], name: str = "scripted", weights: WeightSource | None = None
    ) -> None:
        """With `weights`, completions are stamped with the policy's newest published version (no weights are
        loaded: the script is the policy)."""
        self.tokenizer = tokenizer
        self.version = 0
        self.weights = weights
        self.follows_training = weights is not None
        self.max_positions: int | None = None
        self.name = name
        self._script = [script] if isinstance(script, str) else list(script)
        if not self._script:
            raise ValueError("script must hold at least one reply")
        self._eos = eos_ids(tokenizer)[0]
        self._calls = 0
        self._tokens = 0

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def stats(self) -> dict[str, float]:
        return {
            "requests": float(self._calls),
            "batches": float(self._calls),
            "mean_batch_size": 1.0 if self._calls else 0.0,
            "completion_tokens": float(self._tokens),
            "busy_s": 0.0,
            "tokens_per_s": 0.0,
        }

    def available_version(self, policy: str) -> int:
        return self.weights.latest_version(policy) if self.weights is not None and policy else self.version

    async def generate(self, prompt_ids: list[int], params: SamplingParams, policy: str = "") -> Completion:
        version = self.available_version(policy)
        text = self._script[self._calls % len(self._script)]
        self._calls += 1
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self._eos]
        reason = "stop"
        if len(ids) > params.max_new_tokens:
            ids, reason = ids[: params.max_new_tokens], "length"
        self._tokens += len(ids)
        text = str(self.tokenizer.decode(ids, skip_special_tokens=True))
        return Completion(ids, [0.0] * len(ids), text, reason, version)
