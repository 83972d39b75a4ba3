"""An LLM judge as a reward: fill the spec's template with the episode, ask an OpenAI-compatible chat-completions API
once, read a score from the reply and map it onto [0, 1].

What goes into the template (`trajflow.contracts.reward_models.TEMPLATE_FIELDS`): `{prompt}` is the env's first
observation (the task), `{response}` the agent's last reply, `{reference}` the env's reference answer
(`final_info["answer"]`, as `data:` tasks give it), `{transcript}` every observation and reply in order. A template that
needs what the episode lacks is the request's fault (`RewardInputError`, answered 422).

Failures of the judge are classified as in `trajflow.rewards.model_http` (down → 503, misconfigured or unreadable →
502), never scored. Not covered: streaming, tool calls, reasoning fields of the reply (only `message.content` is read),
and several samples per judgement.
"""

from __future__ import annotations

import os
import re

from trajflow.contracts.reward_models import JudgeModelConfig, template_fields
from trajflow.contracts.scoring import ScoreRequest, ScoreResult
from trajflow.contracts.trajectory import JsonScalar
from trajflow.rewards.model_http import EXCERPT, RewardModelFailed, post_json
from trajflow.rewards.registry import RewardInputError

_NUMBER = r"[-+]?\d+(?:\.\d+)?"
_SCORE_LINE = re.compile(rf"score\W{{0,3}}\s*[:=]\s*\**\s*({_NUMBER})", re.IGNORECASE)
_ANY_NUMBER = re.compile(_NUMBER)


def parse_score(reply: str, spec: JudgeModelConfig) -> float:
    """The judge's raw score in `reply` by the spec's `score_format` (the last match counts); ValueError when there is
    none or it is outside [min_score, max_score]."""
    pattern = _SCORE_LINE if spec.score_format == "score_line" else _ANY_NUMBER
    found = pattern.findall(reply)
    if not found:
        what = '"Score: N" line' if spec.score_format == "score_line" else "number"
        raise ValueError(f"the judge's reply has no {what}")
    raw = float(found[-1])
    if not spec.min_score <= raw <= spec.max_score:
        raise ValueError(f"the judge's score {raw:g} is outside its range [{spec.min_score:g}, {spec.max_score:g}]")
    return raw


def normalise(raw: float, spec: JudgeModelConfig) -> float:
    """`raw` in [min_score, max_score] mapped linearly onto [0, 1]."""
    return (raw - spec.min_score) / (spec.max_score - spec.min_score)


def episode_fields(req: ScoreRequest) -> dict[str, str | None]:
    """What a template may show, from the request (`reference` None when the env gave none)."""
    reference = req.final_info.get("answer")
    lines = []
    for i, observation in enumerate(req.observations):
        lines.append(f"Environment: {observation}")
        if i < len(req.actions):
            lines.append(f"Agent: {req.actions[i]}")
    return {
        "prompt": req.observations[0] if req.observations else None,
        "response": req.actions[-1] if req.actions else "",
        "reference": None if reference is None else str(reference),
        "transcript": "\n\n".join(lines) if req.observations else None,
    }


def judge_prompt(req: ScoreRequest, spec: JudgeModelConfig) -> str:
    """The template filled with the episode; RewardInputError when it needs a field the episode lacks."""
    fields = episode_fields(req)
    missing = sorted(name for name in template_fields(spec.template) if fields[name] is None)
    if missing:
        why = {
            "reference": f"the env {req.env_id!r} gave no reference answer (final_info['answer'])",
            "prompt": "the request carries no observations (the env's first one is the task)",
            "transcript": "the request carries no observations",
        }
        raise RewardInputError(f"the judge's template uses {{{missing[0]}}}, but {why[missing[0]]}")
    return spec.template.format(**{k: v or "" for k, v in fields.items()})


async def score(req: ScoreRequest, spec: JudgeModelConfig) -> ScoreResult:
    """Ask the judge once about `req`'s episode; the reward is its normalised score."""
    key = os.environ.get(spec.api_key_env, "") if spec.api_key_env else ""
    if spec.api_key_env and not key:
        raise RewardModelFailed(f"the judge's API key variable ${spec.api_key_env} is not set on the reward service")
    body = {
        "model": spec.model,
        "messages": [{"role": "user", "content": judge_prompt(req, spec)}],
        "max_tokens": spec.max_tokens,
        "temperature": spec.temperature,
    }
    headers = {"authorization": f"Bearer {key}"} if key else {}
    url = f"{spec.base_url}/chat/completions"
    answer = await post_json(url, body, headers, spec.timeout_s, f"judge {spec.model!r}")
    try:
        reply = answer["choices"][0]["message"]["content"]
        assert isinstance(reply, str)
    except (KeyError, IndexError, TypeError, AssertionError):
        raise RewardModelFailed(
            f"judge {spec.model!r} at {url} answered without choices[0].message.content: {str(answer)[:EXCERPT]!r}"
        ) from None
    try:
        raw = parse_score(reply, spec)
    except ValueError as e:
        raise RewardModelFailed(f"judge {spec.model!r}: {e}: {reply[-EXCERPT:]!r}") from None
    details: dict[str, JsonScalar] = {
        "judge_model": spec.model,
        "judge_score": raw,
        "judge_reply": reply[-EXCERPT:],
        "turns": len(req.actions),
    }
    return ScoreResult(reward=normalise(raw, spec), reward_fn=req.reward_fn, details=details)
