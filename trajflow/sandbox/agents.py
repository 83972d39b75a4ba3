"""The host's side of an `agent:MODULE:FUNCTION` env (`trajflow/envs/agent.py`): how long a call into its sandbox
may take, what its observation is, and the check that a program restored by replay asks what its record says.

- Timeout: the program may work up to its budget (`trajflow.contracts.agent.budget_s`) between an answer and its
  next request, so a reset or step of an agent env gets at least that plus `STEP_MARGIN_S` (`call_s`); the runner's
  own `hung` error (at the budget) comes first, and the sandbox's timeout (which kills the container) only when the
  runner itself is stuck.
- Observation: the program's chat request as JSON (keys sorted by the runner), never cut and never given an
  `info["suffix"]` (the info's timing, `agent_seconds`, stays out of it); one over `MAX_AGENT_REQUEST_CHARS` is an
  `AgentError` of kind malformed_request.
- Replay: each replayed step's observation must have the recorded one's digest (`request_digest`).
Limits: pure functions; the env activities map the errors to Temporal's.
"""

from __future__ import annotations

from collections.abc import Mapping

from trajflow.contracts.agent import call_s, is_agent, request_digest
from trajflow.contracts.limits import MAX_AGENT_REQUEST_CHARS
from trajflow.sandbox.errors import AgentDiverged, EnvError

SHOWN_CHARS = 200
"""How much of the new request a divergence shows."""


def call_timeout_s(env_id: str, env_kwargs: Mapping[str, object], timeout_s: float) -> float:
    """The timeout of one reset or step of `env_id`: `timeout_s` (the worker's step timeout), raised for an agent env
    to its budget (twice it with a verifier) plus the margin."""
    if not is_agent(env_id):
        return timeout_s
    return max(timeout_s, call_s(env_kwargs))


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


def check_replayed(answered: int, expected_digest: str, got: str) -> None:
    """AgentDiverged unless the observation `got` after the `answered`-th replayed action (1-based) has the recorded
    one's digest: the program's call `answered + 1` (or its end)."""
    if request_digest(got) == expected_digest:
        return
    now = "its end (no request)" if not got else f"{got[:SHOWN_CHARS]!r}{'...' if len(got) > SHOWN_CHARS else ''}"
    raise AgentDiverged(
        f"the agent program restored by replay is not deterministic: its call {answered + 1} (after replayed answer "
        f"{answered}) differs from the recorded request (sha256 {expected_digest[:12]}...); now: {now}"
    )
