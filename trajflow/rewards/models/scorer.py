"""Scoring (prompt, response) pairs with a Hugging Face checkpoint on torch, a batch at a time.

Two modes, picked from the checkpoint's `config.architectures`:
- `classifier`: a `*ForSequenceClassification` checkpoint (a reward model). With one label the reward is its logit
  (or `sigmoid(logit)` with `squash`); with several, the probability of the last label ("good"/"correct" by
  convention). The pair is given as a chat (user: prompt, assistant: response) when the tokenizer has a chat
  template, else as `prompt\\n\\nresponse`.
- `yes_no`: any causal LM as a generative verifier. A rubric (`VERIFIER_PROMPT`) asks whether the response
  correctly answers the prompt (showing the reference answer when there is one); the reward is
  P(Yes) / (P(Yes) + P(No)) of the next token after the chat template's generation prompt.

Batches are left-padded for the causal LM (its last position is the one read) and right-padded for classifiers
(which pool the last non-pad token). Not covered: devices other than the one given, quantised checkpoints,
per-token (process) rewards.

Measured (2026-11, this project's 2-core AVX2 CPU, float32): SmolLM2-135M-Instruct in `yes_no` mode does not tell
right from wrong arithmetic answers (about chance over several rubric wordings); it serves here as a real model
to test the plumbing and batching with, not as a judge worth training against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from trajflow.contracts.reward_models import LocalScoreRequest

Mode = Literal["classifier", "yes_no"]
VERIFIER_SYSTEM = "You are a careful grader. Reply with Yes or No only."
VERIFIER_PROMPT = (
    "Question: {prompt}\nProposed answer: {response}\n\nIs the proposed answer correct? Answer with Yes or No."
)
VERIFIER_REFERENCE = (
    "Question: {prompt}\nReference answer: {reference}\nProposed answer: {response}\n\n"
    "Is the proposed answer correct? Answer with Yes or No."
)


@dataclass(frozen=True)
class Scored:
    reward: float
    raw: float


def detect_mode(model_dir: Path) -> Mode:
    """`classifier` for a `*ForSequenceClassification` checkpoint, else `yes_no` (a causal LM)."""
    architectures = AutoConfig.from_pretrained(model_dir).architectures or []
    return "classifier" if any(a.endswith("ForSequenceClassification") for a in architectures) else "yes_no"


def verifier_text(tokenizer: Any, item: LocalScoreRequest) -> str:
    """The yes/no verifier's input for `item`: the rubric in the tokenizer's chat template, up to the generation
    prompt (plain text when the tokenizer has no template)."""
    rubric = VERIFIER_PROMPT if item.reference is None else VERIFIER_REFERENCE
    content = rubric.format(prompt=item.prompt, response=item.response, reference=item.reference)
    if not getattr(tokenizer, "chat_template", None):
        return f"{VERIFIER_SYSTEM}\n\n{content}\nAnswer:"
    chat = [{"role": "system", "content": VERIFIER_SYSTEM}, {"role": "user", "content": content}]
    return str(tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))


class Scorer:
    """A loaded checkpoint that scores batches of `LocalScoreRequest`s (thread-compatible, not thread-safe: the
    batcher calls it from one thread at a time)."""

    def __init__(self, model_dir: str | Path, *, dtype: torch.dtype = torch.float32, squash: bool = False) -> None:
        self.model_dir = Path(model_dir)
        self.mode: Mode = detect_mode(self.model_dir)
        self.squash = squash
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        auto = AutoModelForSequenceClassification if self.mode == "classifier" else AutoModelForCausalLM
        self.model = auto.from_pretrained(self.model_dir, dtype=dtype).eval()
        if self.mode == "classifier" and self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.yes_id, self.no_id = self._token("Yes"), self._token("No")

    def _token(self, word: str) -> int:
        ids = self.tokenizer.encode(word, add_special_tokens=False)
        return int(ids[0]) if ids else -1

    def _has_chat(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def text(self, item: LocalScoreRequest) -> str:
        """What the model reads for `item`."""
        if self.mode == "classifier":
            if not self._has_chat():
                return f"{item.prompt}\n\n{item.response}"
            chat = [{"role": "user", "content": item.prompt}, {"role": "assistant", "content": item.response}]
            return str(self.tokenizer.apply_chat_template(chat, tokenize=False))
        return verifier_text(self.tokenizer, item)

    @torch.inference_mode()
    def score(self, items: Sequence[LocalScoreRequest]) -> list[Scored]:
        """One forward pass over `items`."""
        self.tokenizer.padding_side = "left" if self.mode == "yes_no" else "right"
        texts = [self.text(i) for i in items]
        batch = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=not self._has_chat())
        logits = self.model(**batch).logits.float()
        if self.mode == "classifier":
            return [self._classified(row) for row in logits]
        probs = torch.softmax(logits[:, -1, :], dim=-1)
        out = []
        for row in probs:
            yes, no = float(row[self.yes_id]), float(row[self.no_id])
            out.append(Scored(reward=yes / (yes + no) if yes + no > 0 else 0.5, raw=yes))
        return out

    def _classified(self, row: torch.Tensor) -> Scored:
        if row.numel() == 1:
            logit = float(row[0])
            return Scored(reward=1 / (1 + math.exp(-logit)) if self.squash else logit, raw=logit)
        p = float(torch.softmax(row, dim=-1)[-1])
        return Scored(reward=p, raw=p)
