"""The trajectory workflow's budget for a sandbox that will not start: `env.reset`'s retry policy (three attempts,
Temporal's default first interval and backoff; env and request faults never retried) and the sandbox recoveries a
trajectory may spend before it ends `infra_failed`. Held as literal values, so changing them is a decision."""

from __future__ import annotations

import asyncio

import pytest

from trajflow.contracts import names
from trajflow.contracts.trajectory import EnvResetInput, TrajectoryRequest


def test_env_reset_is_tried_three_times_and_never_retries_an_env_or_request_fault(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trajflow.workflows import stubs

    seen: dict[str, object] = {}

    async def execute_activity(name: str, arg: object, **options: object) -> None:
        seen.update(options, name=name)

    monkeypatch.setattr(stubs.workflow, "execute_activity", execute_activity)
    asyncio.run(stubs.env_reset("p", EnvResetInput(trajectory_id="t", env_id="e", seed=0)))
    policy = seen["retry_policy"]
    assert seen["name"] == names.ENV_RESET
    assert policy.maximum_attempts == 3  # type: ignore[attr-defined]
    assert policy.initial_interval.total_seconds() == 1.0  # type: ignore[attr-defined]
    assert policy.backoff_coefficient == 2.0  # type: ignore[attr-defined]
    fatal = {names.ERR_ENV, names.ERR_BAD_REQUEST, names.ERR_PAYLOADS_TOO_LARGE}
    assert set(policy.non_retryable_error_types) == fatal  # type: ignore[attr-defined]


def test_a_trajectory_recovers_its_sandbox_twice_by_default() -> None:
    assert TrajectoryRequest.model_fields["max_env_recoveries"].default == 2
