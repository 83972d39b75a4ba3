"""Rewards from models: `reward_fn = "model:NAME"` with the request's `reward_model` spec, scored by an LLM judge
(`trajflow.rewards.judge`) or a local reward-model server (`trajflow reward-model serve`, `trajflow/rewards/models/`).

A local model gets `{prompt, response, reference}` (the env's first observation, the agent's last reply, the env's
reference answer when it gave one) and answers a `LocalScoreResult`, whose reward is the trajectory's; its batch
size and raw score go into the details. Failures are classified by `trajflow.rewards.model_http`; a request without a
spec is the request's fault (`RewardInputError`, 422). This module imports no torch: the models run elsewhere.
"""

from __future__ import annotations

from pydantic import ValidationError

from trajflow.contracts.reward_models import (
    MODEL_PREFIX,
    LocalModelConfig,
    LocalScoreRequest,
    LocalScoreResult,
    model_name,
)
from trajflow.contracts.scoring import ScoreRequest, ScoreResult
from trajflow.contracts.trajectory import JsonScalar
from trajflow.rewards import judge
from trajflow.rewards.model_http import EXCERPT, RewardModelFailed, post_json
from trajflow.rewards.registry import RewardInputError


def is_model_reward(reward_fn: str) -> bool:
    """Whether `reward_fn` names a reward model (`model:NAME`) rather than a registered function."""
    return model_name(reward_fn) is not None


async def score(req: ScoreRequest) -> ScoreResult:
    """Score `req` with the reward model its `reward_model` describes."""
    name = model_name(req.reward_fn)
    if not name:
        raise RewardInputError(f"{req.reward_fn!r} names no reward model: expected {MODEL_PREFIX}NAME")
    spec = req.reward_model
    if spec is None:
        raise RewardInputError(
            f"reward_fn {req.reward_fn!r} needs the model's spec in reward_model (a run config fills it in from "
            f"[reward_models.{name}]; a request started by hand must carry it)"
        )
    if spec.kind == "judge":
        return await judge.score(req, spec)
    return await score_local(req, spec)


async def score_local(req: ScoreRequest, spec: LocalModelConfig) -> ScoreResult:
    """Ask a local reward-model server about the episode's task and last reply."""
    if not req.observations:
        raise RewardInputError(
            "a local reward model scores the task (the env's first observation), which the request lacks"
        )
    reference = req.final_info.get("answer")
    body = LocalScoreRequest(
        prompt=req.observations[0],
        response=req.actions[-1] if req.actions else "",
        reference=None if reference is None else str(reference),
    )
    url = f"{spec.url}/score"
    answer = await post_json(url, body.model_dump(mode="json"), {}, spec.timeout_s, "local reward model")
    try:
        result = LocalScoreResult.model_validate(answer)
    except ValidationError as e:
        raise RewardModelFailed(
            f"local reward model at {url} answered no LocalScoreResult ({e.error_count()} "
            f"errors): {str(answer)[:EXCERPT]!r}"
        ) from None
    details: dict[str, JsonScalar] = {
        "model_mode": result.mode,
        "model_raw": result.raw,
        "model_batch_size": result.batch_size,
        "turns": len(req.actions),
    }
    return ScoreResult(reward=result.reward, reward_fn=req.reward_fn, details=details)
