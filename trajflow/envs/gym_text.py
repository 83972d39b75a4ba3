"""Text interfaces for gymnasium envs: how a `gym:` env's observations become text for the LLM, and the LLM's
replies become the env's actions (`trajflow/envs/gym_adapter.py` hosts the env and uses one).

A text interface is a small class, made once per episode from the gymnasium env (`TextInterface`):
- `instructions: str`: what the game is and the exact action format; the first observation starts with it;
- `observation(obs, info) -> str`: one gymnasium observation as text (the env's rewards and the end of the
  episode are told by the adapter);
- `action(text) -> action`: the LLM's whole reply as an action of the env's action space, or `InvalidAction` with
  a message the agent reads (the adapter ends the episode with GEM's format-error reward, never a crash).

Built in: Blackjack (`BlackjackText`, gymnasium's `BlackjackEnv`: `Blackjack-v1`), Frozen Lake (`FrozenLakeText`,
`FrozenLakeEnv`: `FrozenLake-v1`, `FrozenLake8x8-v1` or any map and slipperiness), and `GenericText` for any env
whose observations are text (a `Text` observation space) and whose actions are `Discrete` or `Text`. Actions are
written as GEM's games write them: inside `\\boxed{...}`; only the last box of a reply counts.

Limits: the built-ins are chosen by the env's class (`interface_for`); an env with neither a built-in nor text
spaces has no interface (`NoTextInterface`). Interfaces may keep state between calls of one episode (the move
being made), so each episode makes its own. A user's own interface (to come from a `py:` package) follows the
same protocol. No images: `render()` is never called.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gymnasium import spaces
from gymnasium.envs.toy_text.blackjack import BlackjackEnv, sum_hand
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


class InvalidAction(ValueError):
    """A reply that names no valid action; its message is shown to the agent."""


class NoTextInterface(LookupError):
    """The env has no built-in text interface and its spaces are not text."""


class TextInterface(Protocol):
    """How one gymnasium env speaks text (see the module docstring)."""

    instructions: str

    def observation(self, obs: Any, info: Mapping[str, Any]) -> str: ...

    def action(self, text: str) -> Any: ...


InterfaceFactory = Callable[[Any], TextInterface]
"""Makes an episode's interface from the gymnasium env (as `gymnasium.make` returns it, wrappers included)."""


def boxed(text: str) -> str:
    """The content of the last `\\boxed{...}` in `text`, stripped; `InvalidAction` when there is none."""
    found = BOXED.findall(text)
    if not found:
        raise InvalidAction("no action found: write your action inside \\boxed{...}")
    return found[-1].strip()


def _choice(text: str, words: Mapping[str, int], what: str) -> int:
    word = boxed(text).lower()
    if word not in words:
        known = ", ".join(f"\\boxed{{{w}}}" for w in words)
        raise InvalidAction(f"{word[:40]!r} is not a {what}; expected one of {known}")
    return words[word]


MOVES = {"left": 0, "down": 1, "right": 2, "up": 3}
"""Frozen Lake's actions in gymnasium's order."""
STEPS = {(0, -1): "left", (1, 0): "down", (0, 1): "right", (-1, 0): "up"}


class FrozenLakeText:
    """Frozen Lake: the lake as a grid of letters with `@` where the agent stands; moves are words. After a move,
    the observation says which way the agent went: as chosen, slid aside (slippery ice) or nowhere (an edge)."""

    def __init__(self, env: Any) -> None:
        lake = env.unwrapped
        self.grid = [[cell.decode() for cell in row] for row in lake.desc.tolist()]
        self.ncol = int(lake.ncol)
        self._move: str | None = None
        self._at: tuple[int, int] | None = None
        slippery = any(len(outcomes) > 1 for by_action in lake.P.values() for outcomes in by_action.values())
        limit = env.spec.max_episode_steps if env.spec is not None else None
        rows = len(self.grid)
        self.instructions = (
            "You are playing Frozen Lake.\n"
            f"You walk on a frozen lake, a grid of {rows} rows and {self.ncol} columns, from the start S to the goal "
            "G.\n"
            "F is frozen ice, safe to stand on. H is a hole: stepping into one ends the game with reward 0. "
            "Reaching G ends the game with reward 1.\n"
            "The map shows @ where you stand. Rows count from the top, columns from the left, both from 1. "
            "A move off the edge of the lake leaves you where you are.\n"
            + (
                "The ice is slippery: a move goes the way you chose only some of the time; otherwise you slide "
                "to one of the two sides of it.\n"
                if slippery
                else "The ice is not slippery: every move goes the way you choose.\n"
            )
            + (f"You have at most {limit} moves.\n" if limit else "")
            + "Each turn, answer with one move inside \\boxed{}: \\boxed{left}, \\boxed{down}, \\boxed{right} or "
            "\\boxed{up}. Only the last \\boxed{} of your answer counts."
        )

    def observation(self, obs: Any, info: Mapping[str, Any]) -> str:
        row, col = divmod(int(obs), self.ncol)
        cell = self.grid[row][col]
        where = f"row {row + 1}, column {col + 1}"
        if cell == "H":
            state = f"You fell into the hole at {where}."
        elif cell == "G":
            state = f"You reached the goal at {where}!"
        else:
            state = f"You are at {where}."
        lines = [
            " ".join("@" if (r, c) == (row, col) else x for c, x in enumerate(line)) for r, line in enumerate(self.grid)
        ]
        moved = self._moved(row, col)
        self._at = (row, col)
        return f"{moved}{state}\n" + "\n".join(lines)

    def _moved(self, row: int, col: int) -> str:
        """How the last move went, from where the agent was to where it is ("" before the first move)."""
        if self._move is None or self._at is None:
            return ""
        went = STEPS.get((row - self._at[0], col - self._at[1]))
        if went == self._move:
            return f"You moved {went}. "
        if went is None:
            return f"You chose {self._move} and stayed where you were. "
        return f"You chose {self._move} but slid {went}. "

    def action(self, text: str) -> int:
        move = _choice(text, MOVES, "move")
        self._move = next(word for word, index in MOVES.items() if index == move)
        return move


def _card(value: int) -> str:
    return "A" if value == 1 else str(value)


class BlackjackText:
    """Blackjack against the dealer (gymnasium's rules); the player's cards come from the env itself."""

    def __init__(self, env: Any) -> None:
        self.game = env.unwrapped
        payout = (
            "Winning with a natural blackjack (an ace and a 10-valued card) pays 1.5. "
            if self.game.natural and not self.game.sab
            else ""
        )
        self._last: str | None = None
        self.instructions = (
            "You are playing Blackjack against the dealer.\n"
            "Cards 2 to 10 count their number, the face cards (shown as 10) count 10 and an ace (A) counts 1 or "
            "11: an ace is usable when counting it as 11 does not take your sum past 21.\n"
            "You and the dealer start with two cards each; you see one of the dealer's. You may hit (draw a card) as "
            "often as you like; going past 21 is a bust and you lose. When you stick, the dealer draws until their "
            "sum is 17 or more, and the sum closer to 21 wins.\n"
            f"A win scores 1, a loss -1, a draw 0. {payout}\n"
            "Each turn, answer \\boxed{hit} or \\boxed{stick}. Only the last \\boxed{} of your answer counts."
        )

    def observation(self, obs: Any, info: Mapping[str, Any]) -> str:
        total, showing, usable = (int(x) for x in obs)
        cards = ", ".join(_card(c) for c in self.game.player)
        ace = "a usable ace" if usable else "no usable ace"
        hand = f"Your cards: {cards} (sum {total}, {ace})."
        if self._last == "hit":
            hand = f"You hit and drew {_card(self.game.player[-1])}. {hand}" + (" Bust!" if total > 21 else "")
        if self._last == "stick":
            dealer = ", ".join(_card(c) for c in self.game.dealer)
            return f"You stick with {total}. The dealer's cards: {dealer} (sum {sum_hand(self.game.dealer)})."
        return f"{hand} The dealer shows {_card(showing)}."

    def action(self, text: str) -> int:
        word = _choice(text, {"hit": 1, "stick": 0}, "Blackjack action")
        self._last = "hit" if word else "stick"
        return word


class GenericText:
    """Any env with text observations and `Discrete` or `Text` actions: observations are shown as they are, an
    action is a number (`Discrete`) or a string (`Text`) inside `\\boxed{}`."""

    def __init__(self, env: Any) -> None:
        self.space = env.action_space
        name = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
        if isinstance(self.space, spaces.Discrete):
            low, n = int(self.space.start), int(self.space.n)
            what = f"an integer from {low} to {low + n - 1}, e.g. \\boxed{{{low}}}"
        else:
            shortest, longest = self.space.min_length, self.space.max_length
            what = f"a text of {shortest} to {longest} characters (no braces), e.g. \\boxed{{...}}"
        self.instructions = (
            f"You are interacting with the environment {name}. Each observation is its text.\n"
            f"Each turn, answer with one action inside \\boxed{{}}: {what}. Only the last \\boxed{{}} of your answer "
            "counts."
        )

    def observation(self, obs: Any, info: Mapping[str, Any]) -> str:
        return str(obs)

    def action(self, text: str) -> Any:
        value = boxed(text)
        if isinstance(self.space, spaces.Discrete):
            try:
                action = int(value)
            except ValueError:
                raise InvalidAction(f"{value[:40]!r} is not an integer") from None
        else:
            action = value
        if not self.space.contains(action):
            raise InvalidAction(f"{value[:40]!r} is not an action of this environment ({self.space})")
        return action


BUILT_IN: tuple[tuple[type, InterfaceFactory], ...] = ((FrozenLakeEnv, FrozenLakeText), (BlackjackEnv, BlackjackText))
"""The gymnasium env classes with a built-in interface."""


def interface_for(env: Any) -> TextInterface:
    """The built-in interface for `env`'s class, else `GenericText` when its spaces are text, else
    `NoTextInterface` saying what is missing."""
    for cls, factory in BUILT_IN:
        if isinstance(env.unwrapped, cls):
            return factory(env)
    obs_space, act_space = env.observation_space, env.action_space
    if isinstance(obs_space, spaces.Text) and isinstance(act_space, (spaces.Discrete, spaces.Text)):
        return GenericText(env)
    built_in = ", ".join(cls.__name__ for cls, _ in BUILT_IN)
    raise NoTextInterface(
        f"no text interface: trajflow has built-in ones for {built_in}, and a generic one for envs whose "
        f"observation space is Text and whose action space is Discrete or Text; this env's are {obs_space} and "
        f"{act_space}. An env of its own kind needs a text interface (trajflow/envs/gym_text.py: TextInterface)"
    )
