"""A user's own env (`examples/factoring`, `py:factor_env:FactorEnv`) the way a run submits it: packed into the
store, its image layer built on first use from the package (sympy from its requirements, installed offline from
wheels resolved on the host), then run in hardened sandboxes like any GEM env: a whole trajectory through the
workflow scored by the reward service, a killed sandbox restored by replaying the actions, and the warm pool."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tests.conftest import ROOT, running_stack
from tests.integration.test_trajectory import GatedEngine
from trajflow.cli.replay.env_only import replay_env
from trajflow.contracts import names
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.trajectory import TrajectoryStatus
from trajflow.rl.engines.scripted import ScriptedEngine
from trajflow.sandbox.pool import WarmPool
from trajflow.sandbox.user.submit import package_env
from trajflow.sandbox.user_images import USER_REPO

pytestmark = pytest.mark.integration

FACTOR = "py:factor_env:FactorEnv"
WRONG, RIGHT = "\\boxed{(x + 1)*(x + 2)}", "It is \\boxed{(3*x - 5)*(x + 9)}"  # seed 3: 3*x**2 + 22*x - 45


@pytest.fixture()
def package(store, cache_dir) -> str:
    return package_env(FACTOR, str(ROOT / "examples" / "factoring"), store, cache_dir / "images", print)


def script(tiny_model: Path, replies: list[str]) -> ScriptedEngine:
    return ScriptedEngine(AutoTokenizer.from_pretrained(tiny_model), replies)


async def test_a_trajectory_of_a_user_env_runs_in_its_own_layer(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, package, docker_client
) -> None:
    engine = script(tiny_model, [WRONG, RIGHT])
    stack = running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images)
    async with stack as st:
        req = st.request(env_id=FACTOR, env_package=package, seed=3, max_turns=3, reward_fn="success_or_penalty")
        result = await st.run(req)
        lines: list[str] = []  # the replay tools work on it as on any env: its actions re-driven in a fresh sandbox
        replayed = await replay_env(st.client, st.store, result.workflow_id, 120, False, lines.append)
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert result.turns == 2 and result.reward == 1.0 and result.env_recoveries == 0
    record = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri))
    assert record.first_observation.startswith("Factor the polynomial 3*x**2 + 22*x - 45")
    assert "expands to x**2 + 3*x + 2, not the target. 2 attempt(s) left." in record.turns[0].observation
    assert record.request.env_package == package
    assert replayed == 0 and "replayed 2/2 actions" in "\n".join(lines) and "DIFFERS" not in "\n".join(lines)
    tag = package_images.image_for(FACTOR, package)
    assert tag.startswith(f"{USER_REPO}:")
    assert docker_client.images.get(tag).labels["trajflow.layer"] == "userenv"


async def test_a_killed_sandbox_of_a_user_env_is_restored_by_replay(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, package, docker_client
) -> None:
    engine = GatedEngine(script(tiny_model, [WRONG, WRONG, RIGHT]), gate_at=2)
    stack = running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images)
    async with stack as st:
        handle = await st.start(st.request(env_id=FACTOR, env_package=package, seed=3, max_turns=3))
        await asyncio.wait_for(engine.reached.wait(), 120)
        progress = await handle.query(names.QUERY_PROGRESS)
        docker_client.containers.get(sandbox_manager.get(progress["sandbox"]).container_id).kill()
        engine.released.set()
        result = await handle.result()
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert result.env_recoveries == 1 and result.turns == 3 and result.reward == 1.0
    record = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri))
    # the fresh sandbox replayed both wrong answers: the env's attempt counter went on without a gap
    assert "1 attempt(s) left" in record.turns[1].observation and record.turns[2].observation == "Correct!"


async def test_a_request_without_its_package_fails_as_bad_input(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images
) -> None:
    engine = script(tiny_model, [RIGHT])
    stack = running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images)
    async with stack as st:
        result = await st.run(st.request(env_id=FACTOR, seed=3))
    assert result.status is TrajectoryStatus.FAILED and result.reward is None
    assert "needs its package (env_package)" in (result.error or "")


def test_the_warm_pool_keeps_user_env_sandboxes(sandbox_manager, package_images, package) -> None:
    tag = package_images.image_for(FACTOR, package)
    pool = WarmPool(sandbox_manager, size=1)
    try:
        first, hit = pool.take_noting_hit(FACTOR, tag)
        assert not hit
        assert pool.wait_full(FACTOR, tag, timeout_s=120)
        second, hit = pool.take_noting_hit(FACTOR, tag)
        assert hit
        assert second.reset(FACTOR, 3, {"max_attempts": 1})["observation"].startswith("Factor the polynomial")
        last = second.step("\\boxed{x}")
        assert (
            last["terminated"] and last["reward"] == 0.0 and "The answer was (x + 9)*(3*x - 5)." in last["observation"]
        )
        for box in (first, second):
            sandbox_manager.close(box.id)
    finally:
        pool.close()
