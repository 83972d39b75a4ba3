"""The reward registry: built-in values computed by hand, lookup errors, registration rules."""

from __future__ import annotations

import pytest

from trajflow.contracts.scoring import ScoreRequest, ScoreResult
from trajflow.rewards import registry

BUILTINS = [
    "env_final",
    "env_outcome",
    "exact_match",
    "guess_narrowing",
    "math_verify",
    "regex_match",
    "success",
    "success_or_penalty",
    "verifier",
]


def _req(fn: str, rewards: list[float], actions: int | None = None, **kw: object) -> ScoreRequest:
    n = len(rewards) if actions is None else actions
    return ScoreRequest.model_validate(
        {"reward_fn": fn, "env_id": "game:X", "actions": [f"a{i}" for i in range(n)], "env_rewards": rewards, **kw}
    )


@pytest.fixture
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made by a test vanish after it."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


def test_builtins_are_registered_and_sorted() -> None:
    assert registry.names() == BUILTINS


@pytest.mark.parametrize(
    ("rewards", "expected"),
    [([], 0.0), ([1.0], 1.0), ([0.0, -0.5, 2.0], 1.5), ([-0.1, -0.1, -0.1, 1.0], 0.7)],
)
def test_env_outcome_is_the_sum(rewards: list[float], expected: float) -> None:
    result = registry.score(_req("env_outcome", rewards))
    assert result.reward == pytest.approx(expected)
    assert result.reward_fn == "env_outcome"


@pytest.mark.parametrize(("rewards", "expected"), [([], 0.0), ([0.3], 0.3), ([1.0, -0.5, 0.25], 0.25)])
def test_env_final_is_the_last_reward(rewards: list[float], expected: float) -> None:
    assert registry.score(_req("env_final", rewards)).reward == expected


@pytest.mark.parametrize(
    ("rewards", "expected"),
    [([], 0.0), ([0.0], 0.0), ([0.99], 0.0), ([1.0], 1.0), ([2.5], 1.0), ([1.0, 0.5], 0.0), ([0.0, 0.0, 1.0], 1.0)],
)
def test_success_looks_at_the_last_reward_only(rewards: list[float], expected: float) -> None:
    result = registry.score(_req("success", rewards))
    assert result.reward == expected
    assert result.details["final_env_reward"] == (rewards[-1] if rewards else 0.0)


@pytest.mark.parametrize(
    ("rewards", "expected"),
    [([], 0.0), ([0.0, 0.0, 0.0, 0.89], 0.0), ([-0.1], -0.1), ([0.0, -0.5, 1.0], 1.0), ([-0.1, 0.0, -0.2, 0.7], -0.3)],
)
def test_success_or_penalty_is_one_when_solved_else_the_penalties(rewards: list[float], expected: float) -> None:
    result = registry.score(_req("success_or_penalty", rewards))
    assert result.reward == pytest.approx(expected)
    assert result.details["penalty"] == pytest.approx(sum(r for r in rewards if r < 0))


def test_details_carry_turns_and_how_the_episode_ended() -> None:
    result = registry.score(_req("env_outcome", [0.0, 1.0], actions=3, terminated=True))
    assert result.details == {"turns": 3, "env_steps": 2, "terminated": True, "truncated": False}


def test_get_unknown_lists_known_names() -> None:
    with pytest.raises(registry.UnknownRewardFn) as info:
        registry.get("nope")
    assert info.value.name == "nope"
    assert info.value.known == BUILTINS
    assert "'nope'" in str(info.value) and ", ".join(BUILTINS) in str(info.value)
    assert isinstance(info.value, LookupError)


@pytest.mark.usefixtures("isolated_registry")
def test_register_adds_a_function_and_rejects_a_taken_name() -> None:
    @registry.register("double_outcome", bounded=False)  # a local function: it cannot run in a worker process
    def double_outcome(req: ScoreRequest) -> ScoreResult:
        return ScoreResult(reward=2.0 * sum(req.env_rewards), reward_fn="double_outcome")

    assert registry.get("double_outcome") is double_outcome
    assert registry.score(_req("double_outcome", [0.25, 0.5])).reward == 1.5
    assert "double_outcome" in registry.names()
    with pytest.raises(ValueError, match="already registered"):
        registry.register("env_outcome")(double_outcome)
    with pytest.raises(ValueError, match="non-empty"):
        registry.register(" ")


@pytest.mark.usefixtures("isolated_registry")
def test_score_rejects_a_non_finite_reward() -> None:
    registry.register("broken", bounded=False)(lambda req: ScoreResult(reward=float("nan"), reward_fn="broken"))
    # ScoreResult itself refuses it (trajflow.contracts.trajectory)
    with pytest.raises(ValueError, match="finite number"):
        registry.score(_req("broken", [1.0]))
