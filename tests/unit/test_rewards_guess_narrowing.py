"""`guess_narrowing` on games of GEM's real Guess The Number env, played here with scripted guesses: the rewards by
hand, the payload rule that sends it the observations, and its clear error on an episode it cannot read."""

from __future__ import annotations

import gem
import pytest

from trajflow.contracts.scoring import ScoreRequest
from trajflow.contracts.trajectory import OBSERVING_REWARD_FNS, TrajectoryRequest
from trajflow.envs.formatting import observation_message
from trajflow.lab.analysis.guess_the_number import target_of
from trajflow.rewards import registry
from trajflow.rewards.registry import RewardInputError

ENV_ID = "game:GuessTheNumber-v0-easy"  # 1..10, 4 turns


def _seed_for(target: int) -> int:
    """A seed whose game GEM draws `target` for."""
    for seed in range(1000):
        if target_of(ENV_ID, seed) == target:
            return seed
    raise AssertionError(f"no seed below 1000 draws {target}")


def _play(target: int, guesses: list[str]) -> ScoreRequest:
    """The score request the workflow would send after playing `guesses` (raw actions) against `target`."""
    env = gem.make(ENV_ID)
    seed = _seed_for(target)
    observation, info = env.reset(seed=seed)
    observations, actions, rewards = [observation_message(observation, info)], [], []
    terminated = truncated = False
    for action in guesses:
        observation, reward, terminated, truncated, info = env.step(action)
        actions.append(action)
        rewards.append(float(reward))
        observations.append(observation)
        if terminated or truncated:
            break
    request = TrajectoryRequest(env_id=ENV_ID, seed=seed, reward_fn="guess_narrowing", max_turns=4)
    return request.score_request(actions, rewards, terminated, truncated, {}, observations=observations)


def _boxed(*numbers: int) -> list[str]:
    return [f"\\boxed{{{n}}}" for n in numbers]


@pytest.mark.parametrize(
    ("target", "guesses", "reward", "left", "wasted"),
    [
        # a win scores 1 however it got there
        (3, _boxed(5, 4, 3), 1.0, None, 0),
        (8, _boxed(1, 2, 3, 8), 1.0, None, 0),
        (2, _boxed(6, 6, 2), 1.0, None, 1),
        # halving: 5 (lower: 1..4), 2 (higher: 3..4), 3 (higher: 4); the 4th guess's hint is never shown, but 9 was
        # already ruled out when it was made: one wasted guess
        (4, _boxed(5, 2, 3, 9), 0.5 * 9 / 9 - 0.1, 1, 1),
        (4, _boxed(5, 2, 3, 10), 0.5 * 9 / 9 - 0.1, 1, 1),
        # ... and one that ends on a number still possible wastes nothing: 5 (higher: 6..10), 9 (lower: 6..8),
        # 8 (lower: 6..7), 7
        (6, _boxed(5, 9, 8, 7), 0.5 * 8 / 9, 2, 0),
        # a walk up from 1 against 9: 1, 2, 3 each rule out one number (4..10 left), the 4th guess 4 no hint
        (9, _boxed(1, 2, 3, 4), 0.5 * 3 / 9, 7, 0),
        # against the hint: 5 (lower: 1..4), then 7 and 8 say "lower" again, which rules out nothing new, and 7, 8, 9
        # were each ruled out when guessed
        (2, _boxed(5, 7, 8, 9), 0.5 * 6 / 9 - 0.3, 4, 3),
        # a walk down from 6 against 8: every step after "higher than 6" goes against the hint
        (8, _boxed(6, 5, 4, 3), 0.5 * 6 / 9 - 0.3, 4, 3),
        # repeating a middle guess (GEM answers "already guessed" and charges nothing) keeps the first hint for free
        # no more: 0.5 x 5/9 less three wasted guesses floors at 0.0, still above a malformed answer
        (3, _boxed(6, 6, 6, 6), 0.0, 5, 3),
        # a guess outside the range is wasted too: 6 (lower: 1..5), 11, 2 (higher: 3..5), then 1, already ruled out
        (3, _boxed(6, 11, 2, 1), 0.5 * 7 / 9 - 0.2, 3, 2),
        # a malformed first answer ends the game with the env's format penalty, whatever was narrowed
        (6, ["six"], -0.1, None, 0),
    ],
)
def test_rewards_by_hand(target: int, guesses: list[str], reward: float, left: int | None, wasted: int) -> None:
    request = _play(target, guesses)
    assert request.observations, "the workflow's request carries the observations to this reward"
    result = registry.score(request)
    assert result.reward == pytest.approx(reward)
    assert result.details["won"] is (reward == 1.0)
    assert result.details["wasted_guesses"] == wasted
    if left is not None:
        assert result.details["candidates_left"] == left and result.details["range"] == 10


def test_a_win_outscores_every_loss_and_narrowing_ranks_losses() -> None:
    halving = registry.score(_play(6, _boxed(5, 9, 8, 7))).reward
    walk = registry.score(_play(9, _boxed(1, 2, 3, 4))).reward
    repeat = registry.score(_play(3, _boxed(6, 6, 6, 6))).reward
    malformed = registry.score(_play(6, ["six"])).reward
    assert malformed < repeat < walk < halving < 1.0


def test_only_observing_rewards_get_the_observations() -> None:
    assert "guess_narrowing" in OBSERVING_REWARD_FNS
    assert set(registry.names()) >= OBSERVING_REWARD_FNS  # each one the workflow sends observations to exists
    plain = TrajectoryRequest(env_id=ENV_ID, reward_fn="success_or_penalty")
    assert plain.score_request(["a"], [0.0], True, False, {}, observations=["task", "after"]).observations == []


def test_an_episode_without_the_games_text_is_rejected() -> None:
    with pytest.raises(RewardInputError, match="reads the range"):
        registry.score(ScoreRequest(reward_fn="guess_narrowing", env_id=ENV_ID, actions=["\\boxed{1}"]))
    with pytest.raises(RewardInputError, match="first observation without one"):
        registry.score(ScoreRequest(reward_fn="guess_narrowing", env_id="game:X", observations=["Solve 2 + 2."]))
