"""observation_message: the user message text built from a GEM observation and its info."""

from __future__ import annotations

from trajflow.envs.formatting import observation_message


def test_suffix_is_appended_on_its_own_line() -> None:
    text = observation_message(
        "At turn 1, you guessed 5, and the target number is lower than 5.", {"suffix": "Enter your next guess."}
    )
    assert text == "At turn 1, you guessed 5, and the target number is lower than 5.\nEnter your next guess."


def test_no_double_newline_when_observation_ends_with_one() -> None:
    assert observation_message("Guess.\n", {"suffix": "Enter your next guess."}) == "Guess.\nEnter your next guess."


def test_suffix_already_in_observation_is_not_repeated() -> None:
    obs = "Intro.\nEnter your next guess.\n"
    assert observation_message(obs, {"suffix": "Enter your next guess."}) == obs


def test_missing_empty_or_non_string_suffix_leaves_observation_alone() -> None:
    assert observation_message("obs", {}) == "obs"
    assert observation_message("obs", {"suffix": ""}) == "obs"
    assert observation_message("obs", {"suffix": "   "}) == "obs"
    assert observation_message("obs", {"suffix": 3}) == "obs"
    assert observation_message("obs", {"suffix": None}) == "obs"


def test_empty_observation_gives_just_the_suffix() -> None:
    assert observation_message("", {"suffix": "Enter your guess."}) == "Enter your guess."
