"""Reward models: what a task names with `reward_fn = "model:NAME"`, declared in the run config's
`[reward_models.NAME]`, and the HTTP bodies of a local reward-model server (`trajflow/rewards/models/`).

Two kinds, told apart by `kind`:
- `judge`: an LLM judge behind any OpenAI-compatible chat-completions API (vLLM, SGLang, llama.cpp's server, a
  hosted API). The reward service fills a prompt template with the episode's task prompt, the agent's reply and the
  env's reference answer, asks the judge, reads a score from its reply and maps it onto [0, 1]
  (`trajflow/rewards/judge.py`).
- `local`: a classifier / reward model (or a causal LM used as a yes/no verifier) served by
  `trajflow reward-model serve` (`trajflow/rewards/models/server.py`), which batches concurrent requests.

The spec travels with every `TrajectoryRequest` and `ScoreRequest`, so the reward service stays stateless. It holds
no secret: a judge's API key is read by the reward service from the environment variable `api_key_env` names.
Only pydantic and the standard library are imported.
"""

from __future__ import annotations

import re
import string
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from trajflow.contracts.base import Contract, FiniteFloat

MODEL_PREFIX = "model:"
"""`reward_fn = "model:NAME"` scores with the reward model declared as `[reward_models.NAME]`."""
TEMPLATE_FIELDS = ("prompt", "response", "reference", "transcript")
"""The placeholders a judge template may use: the env's first observation (the task), the agent's last reply, the
env's reference answer (`final_info["answer"]`), and the whole episode as alternating observation / reply lines."""
MAX_TEMPLATE_CHARS = 16_000
MAX_TEXT_CHARS = 64_000
"""What one field of a local reward-model request may hold (a prompt, a response, a reference)."""

DEFAULT_JUDGE_TEMPLATE = """Grade the response to the task below.

Task:
{prompt}

Response:
{response}

Does the response correctly and completely do what the task asks? Explain in one or two sentences, then end with \
a line of the form "Score: N", where N is an integer from 0 (wrong or useless) to 10 (fully correct)."""


def model_name(reward_fn: str) -> str | None:
    """NAME of `model:NAME`, or None when `reward_fn` names a rule reward."""
    return reward_fn[len(MODEL_PREFIX) :] if reward_fn.startswith(MODEL_PREFIX) else None


def template_fields(template: str) -> set[str]:
    """The placeholders `template` uses; ValueError when it is not a valid format string or uses others."""
    try:
        used = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as e:
        raise ValueError(f"not a valid template ({e}); write a literal brace as {{{{ or }}}}") from None
    unknown = sorted(used - set(TEMPLATE_FIELDS))
    if unknown:
        known = ", ".join("{" + f + "}" for f in TEMPLATE_FIELDS)
        raise ValueError(
            f"unknown placeholder(s) {unknown}; a template may use {known} (a literal brace is {{{{ or }}}})"
        )
    return used


def _template(value: str) -> str:
    used = template_fields(value)
    if not used & {"response", "transcript"}:
        raise ValueError("the template never shows the judge the agent's reply: use {response} or {transcript}")
    return value


def _http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")) or not value.split("://", 1)[1].strip("/"):
        raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
    return value.rstrip("/")


HttpUrl = Annotated[str, Field(max_length=1000), AfterValidator(_http_url)]
Timeout = Annotated[float, Field(gt=0.0, le=50.0)]
"""Seconds for one scoring call, at most 50: the `reward.score` activity's own deadline is 60 s."""


class JudgeModelConfig(Contract):
    """An LLM judge behind an OpenAI-compatible chat-completions API."""

    kind: Literal["judge"] = "judge"
    base_url: HttpUrl
    """The API's base URL up to and including `/v1`, e.g. `http://10.0.0.5:8000/v1`; the service POSTs to
    `{base_url}/chat/completions`."""
    model: str = Field(min_length=1, max_length=200)
    """The model's name on the server (vLLM: `--served-model-name`)."""
    api_key_env: str = Field(default="", max_length=100, pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$")
    """The NAME of an environment variable of the reward service that holds the API key (sent as a bearer token);
    empty: no key. Never the key itself: this spec is recorded in workflow history."""
    template: Annotated[str, Field(max_length=MAX_TEMPLATE_CHARS), AfterValidator(_template)] = DEFAULT_JUDGE_TEMPLATE
    """The judge's one user message, with `{prompt}`, `{response}`, `{reference}` and `{transcript}` filled in (see
    `TEMPLATE_FIELDS`); a template with `{reference}` fails (422) on an env that gives no reference answer."""
    score_format: Literal["score_line", "last_number"] = "score_line"
    """How the score is read from the reply: `score_line` is the number after the last `Score:` (or `score =`),
    `last_number` the reply's last number. A reply without one is the judge's failure (never a zero)."""
    min_score: FiniteFloat = 0.0
    """The judge's worst score; it maps to reward 0."""
    max_score: FiniteFloat = 10.0
    """The judge's best score; it maps to reward 1. A score outside [min_score, max_score] is refused."""
    max_tokens: Annotated[int, Field(ge=1, le=8192)] = 256
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 0.0
    timeout_s: Timeout = 30.0
    """The whole judge call (connect, wait, read); past it the judge counts as down (retried, never a zero)."""

    @model_validator(mode="after")
    def _range(self) -> JudgeModelConfig:
        if self.max_score <= self.min_score:
            raise ValueError(f"max_score ({self.max_score}) must be above min_score ({self.min_score})")
        return self


class LocalModelConfig(Contract):
    """A reward model served by `trajflow reward-model serve` (`trajflow/rewards/models/`)."""

    kind: Literal["local"] = "local"
    url: HttpUrl
    """The server's base URL, e.g. `http://127.0.0.1:8090`; the service POSTs to `{url}/score`."""
    timeout_s: Timeout = 30.0
    """The whole call, batching wait included; past it the model counts as down (retried, never a zero)."""


RewardModelConfig = Annotated[JudgeModelConfig | LocalModelConfig, Field(discriminator="kind")]
"""A judge or a local reward model, by `kind`."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_model_name(name: str) -> str:
    """`name` if it may follow `model:`, else ValueError."""
    if not _NAME.fullmatch(name) or len(name) > 90:
        raise ValueError(f"reward model name {name!r}: letters, digits, '_', '.' and '-', at most 90 characters")
    return name


class LocalScoreRequest(Contract):
    """The body of a local reward-model server's `POST /score`."""

    prompt: str = Field(max_length=MAX_TEXT_CHARS)
    response: str = Field(max_length=MAX_TEXT_CHARS)
    reference: str | None = Field(default=None, max_length=MAX_TEXT_CHARS)


class LocalScoreResult(Contract):
    """A local reward model's answer: the reward and how it was computed."""

    reward: FiniteFloat
    mode: Literal["classifier", "yes_no"]
    """`classifier`: a sequence-classification head's score; `yes_no`: P(Yes) / (P(Yes) + P(No)) of a causal LM."""
    raw: FiniteFloat
    """The classifier's logit (num_labels 1) or the last label's probability; P(Yes) unnormalised for `yes_no`."""
    batch_size: Annotated[int, Field(ge=1)]
    """How many requests shared this one's forward pass."""
