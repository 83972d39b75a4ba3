"""The registry of reward functions: name -> pure function from a `ScoreRequest` to a `ScoreResult`.

A reward function sees what the trajectory workflow sends (env id, seed, the agent's actions, the env's per-step
rewards, how the episode ended and the env's final info) and returns a reward with small JSON-scalar details.
Functions must be pure and deterministic: the reward service is stateless and may run many copies.

Built-ins:
- `env_outcome` (the default): the sum of the env's rewards, i.e. the env's own outcome of the episode.
- `env_final`: the last env reward (0.0 when the env gave none).
- `success`: 1.0 if the last env reward is ≥ 1.0, else 0.0.
- `success_or_penalty`: 1.0 if solved (as `success`), else the sum of the env's negative rewards (its penalties
  for malformed or invalid actions), 0.0 when there were none. Partial credit is dropped, so the only way up is to
  solve the task, while a malformed answer still scores below a well-formed miss.

- `guess_narrowing` (GEM's Guess The Number): 1.0 for a win; the env's penalty for a malformed or invalid move (as
  `success_or_penalty`); otherwise half the share of the wrong numbers the game's hints ruled out,
  0.5 x (N - |C|) / (N - 1), N the range's size and C the numbers still consistent with every hint ("the target
  number is higher than 5" keeps 6..N). A fixed walk of guesses rules out one number a hint; a guess in the middle
  that follows the hints halves the range. A guess the earlier hints had already ruled out (a repeat, or a step
  against the hint) costs 0.1 of that, down to 0.0, never below a malformed answer's penalty: GEM charges nothing
  for it, and a policy that repeats a middle guess would otherwise keep the first hint's narrowing for free. So a
  group's lost games differ in reward by how well they used the hints, and a win still outscores any loss. It reads
  the episode's observations, which the workflow sends to the rule rewards named in
  `trajflow.contracts.trajectory.OBSERVING_REWARD_FNS` (to the others it sends none).

- `math_verify`, `exact_match`, `regex_match`: verifier rewards of dataset tasks (`data:NAME`,
  `trajflow/envs/dataset.py`): 1.0 when the last reply's answer (its last `\boxed{...}`, else its last line) matches the
  reference answer the env gives in its final info, by Math-Verify, exact text or a regular expression
  (`trajflow/envs/verify.py`), else 0.0. An episode without a reference is rejected (`RewardInputError`): the task is
  misconfigured, not failed.
- `verifier`: the verdict the dataset env gave the last reply in the sandbox (final info `verified`): the task's
  own verifier function from the user's package (`env_kwargs = { verifier = "MODULE:FUNCTION" }`), else the env's
  checker. User code runs in the task's sandbox, where its requirements are installed, never in this service; an
  episode without a verdict is rejected (`RewardInputError`).

Bounded: every function registered with `@register("name")` (the verifier rewards above and your own) runs in the
reward service under a time limit, in a worker process that is killed when it overruns (`trajflow.rewards.bounded`),
so it must be a module-level function (its process imports it by module and name). The arithmetic built-ins
(`env_outcome`, `env_final`, `success`, `success_or_penalty`, `verifier`), linear in the request's size, are
registered with `bounded=False` and run in the service's threads.

Not covered here: model-based rewards or verifiers that need I/O; register them from their own module with
`@register("name")` (the service sees every function registered by the time it starts).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import NamedTuple

from trajflow.contracts.scoring import ScoreRequest, ScoreResult
from trajflow.contracts.trajectory import JsonScalar
from trajflow.envs import verify

RewardFn = Callable[[ScoreRequest], ScoreResult]
"""A pure function from what the workflow knows about an episode to its reward."""


class Registered(NamedTuple):
    fn: RewardFn
    bounded: bool
    """Whether the reward service runs it under its time limit, in a worker process (`trajflow.rewards.bounded`)."""


_REGISTRY: dict[str, Registered] = {}


class RewardInputError(ValueError):
    """The request lacks what the function needs (e.g. a verifier reward on an env that gives no reference)."""


class UnknownRewardFn(LookupError):
    """No reward function of this name is registered; the message lists the known names."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"unknown reward function {name!r}; known: {', '.join(known) or '(none)'}")
        self.name = name
        self.known = known


def register(name: str, *, bounded: bool = True) -> Callable[[RewardFn], RewardFn]:
    """Decorator: register a reward function under `name`. Registering a taken name is a ValueError.

    `bounded` (the default): the reward service runs it under its time limit in a worker process, which imports it by
    module and name, so a lambda or a function defined inside another is a ValueError. `bounded=False`: it runs in
    the service's threads with no limit; only for functions that cannot run long whatever the request holds."""
    if not name or not name.strip():
        raise ValueError("a reward function needs a non-empty name")

    def decorate(fn: RewardFn) -> RewardFn:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"reward function {name!r} is already registered ({_REGISTRY[name].fn!r})")
        qualname = getattr(fn, "__qualname__", "")
        if bounded and "<" in qualname:  # <lambda>, <locals>: not importable by name
            raise ValueError(
                f"reward function {name!r} ({qualname}) must be a module-level function: the reward service "
                "runs it under a time limit in a worker process, which imports it by module and name; define it at "
                "the top of a module (or register it with bounded=False to run it unbounded in the service's threads)"
            )
        _REGISTRY[name] = Registered(fn, bounded)
        return fn

    return decorate


def get(name: str) -> RewardFn:
    """The reward function registered as `name`; UnknownRewardFn if none is."""
    return registered(name).fn


def registered(name: str) -> Registered:
    """The reward function registered as `name` and whether it runs bounded; UnknownRewardFn if none is."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownRewardFn(name, names()) from None


def names() -> list[str]:
    """The registered names, sorted."""
    return sorted(_REGISTRY)


def score(req: ScoreRequest) -> ScoreResult:
    """Score `req` with the function it names. UnknownRewardFn for an unknown name; ValueError when the
    function returns something other than a ScoreResult with a finite reward (a bug in that function)."""
    result = get(req.reward_fn)(req)
    if not isinstance(result, ScoreResult):
        raise ValueError(f"reward function {req.reward_fn!r} returned {type(result).__name__}, not ScoreResult")
    if not math.isfinite(result.reward):
        raise ValueError(f"reward function {req.reward_fn!r} returned a non-finite reward {result.reward}")
    return result


def _details(req: ScoreRequest) -> dict[str, JsonScalar]:
    """Details every built-in reports: how long the episode was and how it ended."""
    return {
        "turns": len(req.actions),
        "env_steps": len(req.env_rewards),
        "terminated": req.terminated,
        "truncated": req.truncated,
    }


def _final(req: ScoreRequest) -> float:
    """The env's last reward, 0.0 when it gave none; at least 1.0 means the task was solved."""
    return float(req.env_rewards[-1]) if req.env_rewards else 0.0


@register("env_outcome", bounded=False)
def env_outcome(req: ScoreRequest) -> ScoreResult:
    """The sum of the env's per-step rewards: the env's own outcome of the episode."""
    return ScoreResult(reward=float(sum(req.env_rewards)), reward_fn="env_outcome", details=_details(req))


@register("env_final", bounded=False)
def env_final(req: ScoreRequest) -> ScoreResult:
    """The env's last reward, 0.0 when it gave none."""
    return ScoreResult(reward=_final(req), reward_fn="env_final", details=_details(req))


@register("success", bounded=False)
def success(req: ScoreRequest) -> ScoreResult:
    """1.0 when the env's last reward is at least 1.0 (the task was solved), else 0.0."""
    last = _final(req)
    details = _details(req) | {"final_env_reward": last}
    return ScoreResult(reward=1.0 if last >= 1.0 else 0.0, reward_fn="success", details=details)


@register("success_or_penalty", bounded=False)
def success_or_penalty(req: ScoreRequest) -> ScoreResult:
    """1.0 when solved (the last env reward is at least 1.0), else the sum of the env's negative rewards."""
    last = _final(req)
    penalty = float(sum(r for r in req.env_rewards if r < 0))
    details = _details(req) | {"final_env_reward": last, "penalty": penalty}
    return ScoreResult(reward=1.0 if last >= 1.0 else penalty, reward_fn="success_or_penalty", details=details)


RANGE = re.compile(r"between (\d+) and (\d+)")
HINT = re.compile(r"the target number is (higher|lower) than (\d+)")
"""GEM's hint after a guess (also read by `trajflow.lab.analysis.guess_the_number`)."""
GUESS = re.compile(r"\\boxed\{(\d+)\}")
"""A guess as GEM reads it from an action (its pattern): the last match counts."""
NARROWING_WEIGHT = 0.5
"""What a loss that ruled out every wrong number scores: half a win."""
WASTE_CHARGE = 0.1
"""What a lost game pays for each guess the earlier hints had already ruled out."""


def candidates_left(observations: list[str], actions: list[str] | None = None) -> tuple[int, int, int]:
    """(N, |C|, wasted): the range's size, read from the first observation; how many numbers are still consistent
    with every hint in the later ones; and how many of the guesses in `actions` lay outside the numbers the hints
    before them had left (observation i + 1 is the env's answer to action i)."""
    found = RANGE.search(observations[0]) if observations else None
    if found is None:
        raise RewardInputError(
            "guess_narrowing reads the range ('between 1 and 10') from the first observation, and the request has "
            f"{'none' if not observations else 'a first observation without one'}: use it with GEM's Guess The Number"
        )
    low, high = int(found.group(1)), int(found.group(2))
    size, wasted = high - low + 1, 0
    actions = actions or []
    for turn in range(max(len(observations) - 1, len(actions))):
        guessed = GUESS.findall(actions[turn]) if turn < len(actions) else []
        if guessed and not low <= int(guessed[-1]) <= high:
            wasted += 1
        hint = HINT.search(observations[turn + 1]) if turn + 1 < len(observations) else None
        if hint is None:
            continue
        guess = int(hint.group(2))
        if hint.group(1) == "higher":
            low = max(low, guess + 1)
        else:
            high = min(high, guess - 1)
    return size, max(high - low + 1, 0), wasted


@register("guess_narrowing", bounded=False)  # in OBSERVING_REWARD_FNS: it gets the observations
def guess_narrowing(req: ScoreRequest) -> ScoreResult:
    """1.0 for a win, the env's penalty for a bad move, else 0.5 x the share of wrong numbers the hints ruled out,
    less 0.1 for each guess they had already ruled out (down to 0.0)."""
    size, left, wasted = candidates_left(req.observations, req.actions)
    won = bool(req.env_rewards) and req.env_rewards[-1] >= 1.0
    penalty = float(sum(r for r in req.env_rewards if r < 0))
    narrowed = (size - left) / (size - 1) if size > 1 else 1.0
    if won:
        reward = 1.0
    elif penalty < 0:
        reward = penalty
    else:
        reward = max(NARROWING_WEIGHT * min(max(narrowed, 0.0), 1.0) - WASTE_CHARGE * wasted, 0.0)
    details = _details(req) | {
        "won": won,
        "penalty": penalty,
        "range": size,
        "candidates_left": left,
        "wasted_guesses": wasted,
    }
    return ScoreResult(reward=reward, reward_fn="guess_narrowing", details=details)


def _verified(req: ScoreRequest, checker: str, name: str) -> ScoreResult:
    reference = req.final_info.get("answer")
    if reference is None:
        raise RewardInputError(
            f"{name} scores against the reference answer in the env's final info (final_info['answer']), which "
            f"{req.env_id!r} did not give: use it with data: tasks, or an env that reports its answer"
        )
    reply = req.actions[-1] if req.actions else ""
    answer = verify.extract_answer(reply)
    right = bool(answer) and verify.CHECKERS[checker](answer, str(reference))
    details = _details(req) | {"answer": answer[:200], "reference": str(reference)[:200], "correct": right}
    return ScoreResult(reward=1.0 if right else 0.0, reward_fn=name, details=details)


@register("verifier", bounded=False)
def verifier(req: ScoreRequest) -> ScoreResult:
    """The dataset env's verdict on the last reply (final info `verified`): the task's own verifier, or its checker."""
    verdict = req.final_info.get("verified")
    if isinstance(verdict, bool) or not isinstance(verdict, (int, float)) or not math.isfinite(verdict):
        raise RewardInputError(
            f"verifier scores the verdict a data: task's env gives in its final info (final_info['verified']), which "
            f"{req.env_id!r} did not give{f' (it gave {verdict!r:.40})' if verdict is not None else ''}: use it with "
            'data: tasks, with env_kwargs verifier = "MODULE:FUNCTION" for your own'
        )
    details = _details(req) | {"verified": float(verdict), "reference": str(req.final_info.get("answer", ""))[:200]}
    return ScoreResult(reward=float(verdict), reward_fn="verifier", details=details)


@register("math_verify")
def math_verify(req: ScoreRequest) -> ScoreResult:
    """1.0 when the last reply's answer equals the reference mathematically (Math-Verify), else 0.0."""
    return _verified(req, "math", "math_verify")


@register("exact_match")
def exact_match(req: ScoreRequest) -> ScoreResult:
    """1.0 when the last reply's answer is the reference (case and spacing aside), else 0.0."""
    return _verified(req, "exact", "exact_match")


@register("regex_match")
def regex_match(req: ScoreRequest) -> ScoreResult:
    """1.0 when the reference, a regular expression, matches the last reply's whole answer, else 0.0."""
    return _verified(req, "regex", "regex_match")


__all__ = [
    "Registered",
    "RewardInputError",
    "RewardFn",
    "UnknownRewardFn",
    "env_final",
    "env_outcome",
    "exact_match",
    "get",
    "guess_narrowing",
    "math_verify",
    "names",
    "regex_match",
    "register",
    "registered",
    "score",
    "success",
    "success_or_penalty",
    "verifier",
]
