"""The host's side of an `agent:MODULE:FUNCTION` env (`trajflow/envs/agent.py`): how long a call into its sandbox
may take, what its observation is, and the check that a program restored by replay asks what its record says.

- Timeout: the program may work up to `budget_s` (`env_kwargs["budget_s"]`, default `DEFAULT_BUDGET_S`) between an
  answer and its next request, so a reset or step of an agent env gets at least `budget_s + AGENT_STEP_MARGIN_S`; the
  runner's own `hung` error (at `budget_s`) comes first, and the sandbox's timeout (which kills the container) only
  when the runner itself is stuck.
- Observation: the program's chat request as JSON (keys sorted by the runner), never cut and never given an
  `info["suffix"]` (the info's timing, `agent_seconds`, stays out of it); one over `MAX_AGENT_REQUEST_CHARS` is an
  `AgentError` of kind malformed_request.
- Replay: each replayed step's observation must equal the recorded one, character for character.
Limits: pure functions; the env activities map the errors to Temporal's.
"""

from __future__ import annotations

from collections.abc import Mapping

from trajflow.contracts.limits import MAX_AGENT_REQUEST_CHARS
from trajflow.envs.agent import DEFAULT_BUDGET_S
from trajflow.envs.runner import AGENT_PREFIX
from trajflow.sandbox.errors import AgentDiverged, EnvError

AGENT_STEP_MARGIN_S = 30.0
"""How much longer than the program's budget a reset or step of an agent env may take in the sandbox."""
SHOWN_CHARS = 200
"""How much of each side a divergence shows, from the first character that differs."""


def is_agent(env_id: str) -> bool:
    return env_id.startswith(AGENT_PREFIX)


def budget_s(env_kwargs: Mapping[str, object]) -> float:
    """The program's budget between calls, as the runner reads it (a bad value: the default; the runner refuses it)."""
    value = env_kwargs.get("budget_s", DEFAULT_BUDGET_S)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return DEFAULT_BUDGET_S
    return float(value)


def call_timeout_s(env_id: str, env_kwargs: Mapping[str, object], timeout_s: float) -> float:
    """The timeout of one reset or step of `env_id`: `timeout_s` (the worker's step timeout), raised for an agent env
    to its budget plus the margin."""
    if not is_agent(env_id):
        return timeout_s
    return max(timeout_s, budget_s(env_kwargs) + AGENT_STEP_MARGIN_S)


def agent_observation(observation: str) -> str:
    """An agent env's observation, whole; EnvError (AgentError, malformed_request) when it is too large to carry."""
    if len(observation) > MAX_AGENT_REQUEST_CHARS:
        raise EnvError(
            "AgentError",
            f"agent request too large: {len(observation):,} chars > {MAX_AGENT_REQUEST_CHARS:,} (the whole "
            "conversation travels in one Temporal payload, at most 2 MB)",
            "malformed_request",
        )
    return observation


def check_replayed(answered: int, expected: str, got: str) -> None:
    """AgentDiverged unless the observation `got` after the `answered`-th replayed action (1-based) equals the recorded
    one: the program's call `answered + 1` (or its end)."""
    if got == expected:
        return
    at = next((i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b), min(len(expected), len(got)))
    raise AgentDiverged(
        f"the agent program restored by replay is not deterministic: its call {answered + 1} (after replayed answer "
        f"{answered}) differs from the record at character {at}: recorded {expected[at : at + SHOWN_CHARS]!r}, "
        f"now {got[at : at + SHOWN_CHARS]!r}"
    )
