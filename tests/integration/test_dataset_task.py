"""A dataset task (`data:chain_sum`, `examples/arithmetic`) the way a run submits it: the JSONL file packed into the
store, its layer built from the package, each episode one row picked by its seed in a hardened sandbox, scored by
the reward service's Math-Verify verifier; with attempts, the env's own feedback between tries."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, running_stack
from tests.integration.test_user_env import script
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.trajectory import TrajectoryStatus
from trajflow.envs.dataset import HELD_OUT_FROM
from trajflow.sandbox.user.submit import package_env

pytestmark = pytest.mark.integration

DATA = "data:chain_sum"
SHIPPED = ROOT / "examples" / "arithmetic" / "chain_sum.jsonl"
ROWS = [json.loads(line) for line in SHIPPED.read_text().splitlines()]
TRAIN = [r for r in ROWS if r["split"] == "train"]
TEST = [r for r in ROWS if r["split"] == "test"]


@pytest.fixture()
def package(store, cache_dir) -> str:
    return package_env(DATA, str(SHIPPED), store, cache_dir / "images", print)


async def test_single_turn_rows_are_scored_by_the_verifier(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, package
) -> None:
    seed = 5
    row = TRAIN[seed % len(TRAIN)]
    engine = script(tiny_model, [f"The sum is \\boxed{{{row['answer']}}}", "\\boxed{123456}"])
    stack = running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images)
    async with stack as st:
        right = await st.run(
            st.request(env_id=DATA, env_package=package, seed=seed, max_turns=1, reward_fn="math_verify")
        )
        held = st.request(
            env_id=DATA, env_package=package, seed=HELD_OUT_FROM + 3, max_turns=1, reward_fn="math_verify"
        )
        wrong = await st.run(held)
    assert right.status is TrajectoryStatus.COMPLETED and right.reward == 1.0 and right.turns == 1, right.error
    assert wrong.status is TrajectoryStatus.COMPLETED and wrong.reward == 0.0  # a wrong answer scores 0, not a failure
    first = TrajectoryRecord.model_validate(store.get_json(right.trajectory_uri))
    held_out = TrajectoryRecord.model_validate(store.get_json(wrong.trajectory_uri))
    assert first.first_observation == row["prompt"]
    assert held_out.first_observation == TEST[3]["prompt"]  # a held-out seed is a test row


async def test_attempts_get_feedback_from_the_env(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, package
) -> None:
    row = TRAIN[0]
    engine = script(tiny_model, ["\\boxed{999}", f"\\boxed{{{row['answer']}}}"])
    stack = running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images)
    async with stack as st:
        kwargs = {"attempts": 2}
        req = st.request(
            env_id=DATA, env_package=package, seed=0, env_kwargs=kwargs, max_turns=2, reward_fn="math_verify"
        )
        result = await st.run(req)
    assert result.status is TrajectoryStatus.COMPLETED and result.reward == 1.0 and result.turns == 2, result.error
    record = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri))
    assert record.turns[0].observation.startswith("That is not correct. 1 attempt(s) left.")
    assert [t.env_reward for t in record.turns] == [0.0, 1.0]


async def test_a_verifier_reward_on_an_env_without_a_reference_fails_as_misconfigured(
    temporal_env, reward_service, store, sandbox_manager, tiny_model
) -> None:
    engine = script(tiny_model, ["\\boxed{5}"])
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as st:
        result = await st.run(
            st.request(env_id="game:GuessTheNumber-v0-easy", seed=1, max_turns=1, reward_fn="math_verify")
        )
    assert result.status is TrajectoryStatus.FAILED and result.reward is None
    assert "final_info['answer']" in (result.error or "")


async def test_the_tasks_own_verifier_judges_in_the_sandbox_and_the_reward_service_scores_its_verdict(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, cache_dir
) -> None:
    kwargs = {"verifier": "sum_check:check"}  # examples/arithmetic/sum_check.py, packed with the dataset
    package = package_env(DATA, str(SHIPPED), store, cache_dir / "images", print, kwargs)
    row = TRAIN[2]
    replies = [f"\\boxed{{{row['answer']}.0}}", f"the answer is {row['answer']}"]  # math_verify-right, but no box
    engine = script(tiny_model, replies)
    stack = running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images)
    async with stack as st:
        runs = [
            st.request(env_id=DATA, env_package=package, env_kwargs=kwargs, seed=2, max_turns=1, reward_fn="verifier")
            for _ in replies
        ]
        results = [await st.run(req) for req in runs]
    assert [r.status for r in results] == [TrajectoryStatus.COMPLETED] * 2, [r.error for r in results]
    assert [r.reward for r in results] == [1.0, -0.1]  # sum_check's verdicts: right, and unboxed
    record = TrajectoryRecord.model_validate(store.get_json(results[1].trajectory_uri))
    assert record.reward_details["verified"] == -0.1 and record.turns[0].env_reward == -0.1
