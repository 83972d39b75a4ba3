"""Hosts a gymnasium env as a text env, for the runner's `gym:<ID>` env ids: `reset(seed) -> (text, info)` and
`step(text) -> (text, reward, terminated, truncated, info)`, the GEM convention that `trajflow/envs/runner.py` speaks.

The env is `gymnasium.make(ID, **env_kwargs)`: a registered id (`FrozenLake-v1`, `Blackjack-v1`), or
`module:Name-v0`, which imports `module` (installed in the image) so that it registers its envs. Its text
interface (`trajflow/envs/gym_text.py`) is the one passed in, else the built-in for its class, else the generic one for
text spaces; an env with none fails at construction (`NoTextInterface`, saying what is missing). The first observation
is the interface's instructions followed by the observation. A reply that is not a valid action is the env's
answer, as in GEM's games: the gymnasium env is not stepped, the observation says what was wrong, the reward is
GEM's format-error reward and the episode ends. When an episode ends, the observation says so, with the reward.

Seeds: `reset(seed)` seeds gymnasium's generator, so the same seed and the same replies give the same episode
(a malformed reply draws nothing from it), which is what restoring a sandbox by replay needs.
Limits: one episode at a time; a step after the end is an error (`EpisodeOver`); gymnasium's own env checker
and time limit (`max_episode_steps`, which env_kwargs may set) stay on; no rendering.
"""

from __future__ import annotations

from typing import Any

import gymnasium
from gymnasium import error as gym_error

if __package__:
    from trajflow.envs.gym_text import InterfaceFactory, InvalidAction, NoTextInterface, TextInterface, interface_for
else:  # beside the runner in the sandbox image
    from gym_text import InterfaceFactory, InvalidAction, NoTextInterface, TextInterface, interface_for

FORMAT_ERROR_REWARD = -0.1
"""GEM's `LanguageGameReward.format_error_reward`: a reply with no valid action (the `success_or_penalty` reward
counts it as a penalty)."""

UNKNOWN_ID_ERRORS = (
    gym_error.NameNotFound,
    gym_error.NamespaceNotFound,
    gym_error.VersionNotFound,
    gym_error.DeprecatedEnv,
    gym_error.UnregisteredEnv,
)
"""What `gymnasium.make` raises for an id it does not know (other errors mean the env exists but cannot start)."""

__all__ = ["FORMAT_ERROR_REWARD", "EpisodeOver", "GymTextEnv", "NoTextInterface", "UnknownGymEnv"]


class UnknownGymEnv(LookupError):
    """No gymnasium env is registered under that id."""


class EpisodeOver(RuntimeError):
    """A step after the episode ended; reset first."""


class GymTextEnv:
    """One gymnasium env speaking text through its interface."""

    def __init__(self, env_id: str, interface: InterfaceFactory | None = None, **env_kwargs: Any) -> None:
        self.env_id = env_id
        try:
            self.env = gymnasium.make(env_id, **env_kwargs)
        except UNKNOWN_ID_ERRORS as e:
            raise UnknownGymEnv(f"no gymnasium environment {env_id!r}: {e}") from e
        self._make_interface = interface or interface_for
        try:
            self.interface: TextInterface = self._make_interface(self.env)
        except NoTextInterface as e:
            self.env.close()
            raise NoTextInterface(f"gymnasium environment {env_id!r} has {e}") from e
        self.turn = 0
        self.done = True

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed)
        self.interface = self._make_interface(self.env)  # a fresh one per episode: interfaces may keep state
        self.turn, self.done = 0, False
        return f"{self.interface.instructions}\n\n{self.interface.observation(obs, info)}", dict(info)

    def step(self, text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.done:
            raise EpisodeOver("the episode is over (or was never started): reset first")
        self.turn += 1
        try:
            action = self.interface.action(text)
        except InvalidAction as e:
            self.done = True
            observation = f"At turn {self.turn}, you did not give a valid action: {e}. The game is over."
            return observation, FORMAT_ERROR_REWARD, True, False, {"invalid_action": True}
        obs, reward, terminated, truncated, info = self.env.step(action)
        observation = self.interface.observation(obs, info)
        if terminated or truncated:
            self.done = True
            why = "" if terminated else f" after {self.turn} moves, the most this game allows"
            observation += f"\nThe game is over{why}. Your reward: {float(reward):g}."
        return observation, float(reward), bool(terminated), bool(truncated), dict(info)

    def close(self) -> None:
        self.env.close()
