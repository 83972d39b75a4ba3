"""Game-aware reward functions: rewards that read the game's own text (its observations) to score how an episode
went, not only whether it was won.

- `guess_narrowing` (GEM's Guess The Number): 1.0 for a win; a malformed or invalid move scores the env's penalty
  (the sum of its negative rewards) as in `success_or_penalty`; otherwise half the share of the wrong numbers the
  game's hints have ruled out: 0.5 x (N - |C|) / (N - 1), where N is the range's size and C the numbers still
  consistent with every hint ("the target number is higher than 5" keeps 6..N). A loss that narrowed the range to
  one number scores 0.5, one that learned nothing 0.0. A policy that walks a fixed sequence of guesses narrows the
  range by one number a hint; one that guesses in the middle and follows the hints halves it. So, unlike the win
  alone, a group's lost games differ in reward by how well they used the hints, and the win still outscores any
  loss.

These functions need the episode's observations: the workflow sends them to a reward function named in
`trajflow.contracts.trajectory.OBSERVING_REWARD_FNS` (to a plain rule reward it sends none, to keep the payload
small). An episode without them, or whose first observation names no range, is rejected (`RewardInputError`).
"""

from __future__ import annotations

import re

from trajflow.contracts.trajectory import OBSERVING_REWARD_FNS, ScoreRequest, ScoreResult
from trajflow.rewards.registry import RewardInputError, register

RANGE = re.compile(r"between (\d+) and (\d+)")
HINT = re.compile(r"the target number is (higher|lower) than (\d+)")
NARROWING_WEIGHT = 0.5
"""What a loss that ruled out every wrong number scores: half a win."""


def candidates_left(observations: list[str]) -> tuple[int, int]:
    """(N, |C|): the range's size, read from the first observation, and how many numbers are still consistent with
    every hint in the later ones."""
    found = RANGE.search(observations[0]) if observations else None
    if found is None:
        raise RewardInputError(
            "guess_narrowing reads the range ('between 1 and 10') from the first observation, and the request has "
            f"{'none' if not observations else 'a first observation without one'}: use it with GEM's Guess The Number"
        )
    low, high = int(found.group(1)), int(found.group(2))
    size = high - low + 1
    for observation in observations[1:]:
        hint = HINT.search(observation)
        if hint is None:
            continue
        guess = int(hint.group(2))
        if hint.group(1) == "higher":
            low = max(low, guess + 1)
        else:
            high = min(high, guess - 1)
    return size, max(high - low + 1, 0)


@register("guess_narrowing", bounded=False)
def guess_narrowing(req: ScoreRequest) -> ScoreResult:
    """1.0 for a win, the env's penalty for a bad move, else 0.5 x the share of wrong numbers the hints ruled out."""
    size, left = candidates_left(req.observations)
    won = bool(req.env_rewards) and req.env_rewards[-1] >= 1.0
    penalty = float(sum(r for r in req.env_rewards if r < 0))
    narrowed = (size - left) / (size - 1) if size > 1 else 1.0
    if won:
        reward = 1.0
    elif penalty < 0:
        reward = penalty
    else:
        reward = NARROWING_WEIGHT * min(max(narrowed, 0.0), 1.0)
    details = {"won": won, "penalty": penalty, "range": size, "candidates_left": left, "turns": len(req.actions)}
    return ScoreResult(reward=reward, reward_fn="guess_narrowing", details=details)


assert "guess_narrowing" in OBSERVING_REWARD_FNS
