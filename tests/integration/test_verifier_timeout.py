"""A verifier timeout through the whole stack: a dataset task scored by `math_verify`, whose (scripted) reply is the
crafted `\\boxed{9**9**9**9}`, ends `failed` with a `VerifierTimedOut` error and no reward, never `completed` with a
zero; the same task with the right reply on the same stack and reward service is scored 1.0 afterwards.

The env judges replies with `check = "exact"`: its own checker runs in the sandbox (not bounded by the reward
service; a sandbox step has its own `step_timeout`), and Math-Verify there would spin on the same reply.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, running_stack
from tests.integration.test_user_env import script
from trajflow.contracts import names
from trajflow.contracts.trajectory import TrajectoryStatus
from trajflow.sandbox.user.submit import package_env

pytestmark = pytest.mark.integration

DATA = "data:chain_sum"
SHIPPED = ROOT / "examples" / "arithmetic" / "chain_sum.jsonl"


@pytest.fixture
def package(store, cache_dir) -> str:
    return package_env(DATA, str(SHIPPED), store, cache_dir / "images", print)


async def test_a_verifier_timeout_fails_the_trajectory_unscored(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, package
) -> None:
    rows = [json.loads(line) for line in SHIPPED.read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    seed = 5
    right = f"The sum is \\boxed{{{train[seed % len(train)]['answer']}}}"
    engine = script(tiny_model, ["The sum is \\boxed{9**9**9**9}", right])
    stack = running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images)
    async with stack as st:
        fields = {"env_id": DATA, "env_package": package, "max_turns": 1, "reward_fn": "math_verify"}
        req = st.request(seed=seed, env_kwargs={"check": "exact"}, **fields)
        crafted = await st.run(req)
        scored = await st.run(req)
    assert crafted.status is TrajectoryStatus.FAILED and crafted.reward is None, crafted
    assert names.ERR_VERIFIER_TIMEOUT in (crafted.error or "")
    assert "verifier 'math_verify' timed out after" in (crafted.error or "")
    assert scored.status is TrajectoryStatus.COMPLETED and scored.reward == 1.0, scored
