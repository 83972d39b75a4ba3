"""`gym:` envs: the text interfaces of `trajflow/envs/gym_text.py` and the adapter of `trajflow/envs/gym_adapter.py`, on
real gymnasium envs, with expectations worked out by hand from gymnasium's maps and rules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import gymnasium
import pytest
from gymnasium import spaces
from gymnasium.envs.toy_text.blackjack import BlackjackEnv

from trajflow.envs.gym_adapter import FORMAT_ERROR_REWARD, EpisodeOver, GymTextEnv, NoTextInterface, UnknownGymEnv
from trajflow.envs.gym_text import InvalidAction, boxed

LAKE = ["S F F F", "F H F H", "F F F H", "H F F G"]
"""FrozenLake-v1's 4x4 map, as the interface prints it."""


def lake(at: tuple[int, int]) -> str:
    rows = [row.split() for row in LAKE]
    rows[at[0]][at[1]] = "@"
    return "\n".join(" ".join(row) for row in rows)


def test_boxed_takes_the_last_box_stripped() -> None:
    assert boxed("first \\boxed{up}, no: \\boxed{ Down }") == "Down"
    with pytest.raises(InvalidAction, match="inside \\\\boxed"):
        boxed("I go down")


def test_frozen_lake_walks_to_the_goal() -> None:
    env = GymTextEnv("FrozenLake-v1", is_slippery=False)
    first, info = env.reset(seed=0)
    assert first.startswith("You are playing Frozen Lake.\n")
    assert "grid of 4 rows and 4 columns" in first and "not slippery" in first and "at most 100 moves" in first
    assert "\\boxed{left}, \\boxed{down}, \\boxed{right} or \\boxed{up}" in first
    assert first.endswith(f"\n\nYou are at row 1, column 1.\n{lake((0, 0))}") and info == {"prob": 1}
    path = [("down", (1, 0)), ("down", (2, 0)), ("right", (2, 1)), ("right", (2, 2)), ("down", (3, 2))]
    for move, (row, col) in path:
        text, reward, terminated, truncated, _ = env.step(f"I will go \\boxed{{{move}}}.")
        assert text == f"You moved {move}. You are at row {row + 1}, column {col + 1}.\n{lake((row, col))}"
        assert (reward, terminated, truncated) == (0.0, False, False)
    text, reward, terminated, truncated, _ = env.step("\\boxed{RIGHT}")
    assert (
        text == f"You moved right. You reached the goal at row 4, column 4!\n{lake((3, 3))}\n"
        "The game is over. Your reward: 1."
    )
    assert (reward, terminated, truncated) == (1.0, True, False)
    with pytest.raises(EpisodeOver):
        env.step("\\boxed{up}")


def test_a_second_episode_starts_afresh() -> None:
    env = GymTextEnv("FrozenLake-v1", is_slippery=False)
    first = env.reset(seed=0)[0]
    env.step("\\boxed{right}")
    assert env.reset(seed=0)[0] == first  # no "You moved" left over from the last episode


def test_frozen_lake_hole_edge_and_time_limit() -> None:
    env = GymTextEnv("FrozenLake-v1", is_slippery=False)
    env.reset(seed=1)
    text, *_ = env.step("\\boxed{up}")  # off the edge: stays at the start
    assert text == f"You chose up and stayed where you were. You are at row 1, column 1.\n{lake((0, 0))}"
    env.step("\\boxed{right}")
    text, reward, terminated, truncated, _ = env.step("\\boxed{down}")
    hole = f"You moved down. You fell into the hole at row 2, column 2.\n{lake((1, 1))}"
    assert text == f"{hole}\nThe game is over. Your reward: 0."
    assert (reward, terminated, truncated) == (0.0, True, False)
    env = GymTextEnv("FrozenLake-v1", is_slippery=False, max_episode_steps=3)
    assert "at most 3 moves" in env.reset(seed=1)[0]
    for _ in range(3):
        text, reward, terminated, truncated, _ = env.step("\\boxed{left}")
    assert (terminated, truncated) == (False, True)
    assert text.endswith("The game is over after 3 moves, the most this game allows. Your reward: 0.")


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        ("left", "no action found: write your action inside \\boxed{...}"),
        (
            "\\boxed{jump}",
            "'jump' is not a move; expected one of \\boxed{left}, \\boxed{down}, \\boxed{right}, \\boxed{up}",
        ),
    ],
)
def test_a_malformed_reply_ends_the_episode_with_the_format_penalty(reply: str, why: str) -> None:
    env = GymTextEnv("FrozenLake-v1")
    env.reset(seed=0)
    env.step("\\boxed{down}")
    text, reward, terminated, truncated, info = env.step(reply)
    assert text == f"At turn 2, you did not give a valid action: {why}. The game is over."
    assert (reward, terminated, truncated, info) == (FORMAT_ERROR_REWARD, True, False, {"invalid_action": True})
    assert FORMAT_ERROR_REWARD == -0.1  # GEM's LanguageGameReward.format_error_reward


def episode(env_id: str, seed: int, replies: list[str], **kwargs: Any) -> list[str]:
    env = GymTextEnv(env_id, **kwargs)
    texts = [env.reset(seed)[0]]
    for reply in replies:
        text, _, terminated, truncated, _ = env.step(reply)
        texts.append(text)
        if terminated or truncated:
            break
    return texts


def test_the_slippery_lake_is_deterministic_per_seed() -> None:
    moves = ["\\boxed{right}", "\\boxed{down}"] * 10
    assert episode("FrozenLake-v1", 5, moves) == episode("FrozenLake-v1", 5, moves)
    assert "The ice is slippery" in episode("FrozenLake-v1", 5, [])[0]
    # the slide is drawn from the seed: over a few seeds, some first moves go astray
    firsts = {episode("FrozenLake-v1", seed, ["\\boxed{right}"])[1].split("\n")[0] for seed in range(12)}
    assert firsts <= {
        "You moved right. You are at row 1, column 2.",
        "You chose right but slid down. You are at row 2, column 1.",
        "You chose right and stayed where you were. You are at row 1, column 1.",  # slid up, into the edge
    }
    assert len(firsts) > 1


def test_blackjack_reset_is_deterministic_and_matches_the_deal() -> None:
    assert episode("Blackjack-v1", 3, []) == episode("Blackjack-v1", 3, [])
    env = GymTextEnv("Blackjack-v1")
    first, _ = env.reset(seed=3)
    assert first.startswith("You are playing Blackjack against the dealer.\n")
    assert "Each turn, answer \\boxed{hit} or \\boxed{stick}." in first
    game = cast(BlackjackEnv, env.env.unwrapped)
    card = {1: "A"}.get(game.dealer[0], str(game.dealer[0]))
    assert first.endswith(f"The dealer shows {card}.")


def test_blackjack_stick_on_a_hand_set_by_hand() -> None:
    env = GymTextEnv("Blackjack-v1")
    env.reset(seed=0)
    game = cast(BlackjackEnv, env.env.unwrapped)
    game.player, game.dealer = [1, 6], [10, 7]
    assert env.interface.observation((17, 10, 1), {}) == "Your cards: A, 6 (sum 17, a usable ace). The dealer shows 10."
    # the dealer stands on 17 and draws nothing: 17 against 17 is a draw
    text, reward, terminated, _, _ = env.step("I'll stop here: \\boxed{stick}")
    assert text == "You stick with 17. The dealer's cards: 10, 7 (sum 17).\nThe game is over. Your reward: 0."
    assert (reward, terminated) == (0.0, True)


def test_blackjack_hit_from_a_hard_21_busts() -> None:
    env = GymTextEnv("Blackjack-v1")
    env.reset(seed=0)
    game = cast(BlackjackEnv, env.env.unwrapped)
    game.player, game.dealer = [10, 10, 1], [9, 5]
    text, reward, terminated, _, _ = env.step("\\boxed{Hit}")
    drawn = game.player[-1]
    shown = "A" if drawn == 1 else str(drawn)
    assert text == (
        f"You hit and drew {shown}. Your cards: 10, 10, A, {shown} (sum {21 + drawn}, no usable ace). Bust! "
        "The dealer shows 9.\nThe game is over. Your reward: -1."
    )
    assert (reward, terminated) == (-1.0, True)


class _Countdown(gymnasium.Env):
    """A text env: says how many steps are left; any action counts one down."""

    observation_space = spaces.Text(max_length=32, charset="0123456789 abcdefghijklmnopqrstuvwxyz")

    def __init__(self, text_actions: bool = False) -> None:
        self.action_space = spaces.Text(max_length=8) if text_actions else spaces.Discrete(3, start=1)
        self.left = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.left = 2
        return "2 steps left", {}

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.left -= 1
        return f"{self.left} steps left after {action}", 0.5, self.left == 0, False, {}


gymnasium.register(id="TrajflowCountdown-v0", entry_point=lambda **kwargs: _Countdown(**kwargs))


def test_a_text_env_gets_the_generic_interface() -> None:
    env = GymTextEnv("TrajflowCountdown-v0")
    first, _ = env.reset(seed=0)
    assert first == (
        "You are interacting with the environment TrajflowCountdown-v0. Each observation is its text.\n"
        "Each turn, answer with one action inside \\boxed{}: an integer from 1 to 3, e.g. \\boxed{1}. "
        "Only the last \\boxed{} of your answer counts.\n\n2 steps left"
    )
    assert env.step("\\boxed{3}")[:3] == ("1 steps left after 3", 0.5, False)
    assert env.step("\\boxed{4}")[0] == (
        "At turn 2, you did not give a valid action: '4' is not an action of this environment "
        "(Discrete(3, start=1)). The game is over."
    )
    env.reset(seed=0)
    assert "'x' is not an integer" in env.step("\\boxed{x}")[0]
    texts = GymTextEnv("TrajflowCountdown-v0", text_actions=True)
    texts.reset(seed=0)
    assert texts.step("\\boxed{hello}")[0] == "1 steps left after hello"
    assert "is not an action of this environment" in texts.step("\\boxed{much too long}")[0]


class _Digits:
    """A user's own interface: FrozenLake's actions as gymnasium's numbers."""

    instructions = "Answer 0 to 3."

    def __init__(self, env: Any) -> None:
        self.size = env.unwrapped.ncol

    def observation(self, obs: Any, info: Mapping[str, Any]) -> str:
        return f"cell {obs} of {self.size * self.size}"

    def action(self, text: str) -> int:
        if text.strip() not in {"0", "1", "2", "3"}:
            raise InvalidAction(f"{text!r} is not 0 to 3")
        return int(text)


def test_an_interface_can_be_passed_in() -> None:
    env = GymTextEnv("FrozenLake-v1", interface=_Digits, is_slippery=False)
    assert env.reset(seed=0)[0] == "Answer 0 to 3.\n\ncell 0 of 16"
    assert env.step("2")[0] == "cell 1 of 16"
    assert (
        env.step("right")[0] == "At turn 2, you did not give a valid action: 'right' is not 0 to 3. The game is over."
    )


@pytest.mark.filterwarnings("ignore:.*out of date:DeprecationWarning")
@pytest.mark.parametrize("env_id", ["NoSuchEnv-v0", "Taxi-v3", "FrozenLake-v9", "nosuchspace/Thing-v0"])
def test_unknown_ids(env_id: str) -> None:
    with pytest.raises(UnknownGymEnv, match=f"no gymnasium environment '{env_id}'"):
        GymTextEnv(env_id)


@pytest.mark.parametrize(("env_id", "spaces_text"), [("Taxi-v4", "Discrete(500)"), ("CartPole-v1", "Box(")])
def test_envs_without_a_text_interface_say_what_is_missing(env_id: str, spaces_text: str) -> None:
    with pytest.raises(NoTextInterface) as caught:
        GymTextEnv(env_id)
    message = str(caught.value)
    assert message.startswith(f"gymnasium environment '{env_id}' has no text interface")
    assert spaces_text in message and "FrozenLakeEnv, BlackjackEnv" in message and "TextInterface" in message
