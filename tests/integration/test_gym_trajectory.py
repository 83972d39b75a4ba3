"""`gym:` envs through the whole stack: TrajectoryWorkflow -> decode (a scripted policy, or the tiny real HF policy)
-> env.reset / env.step of gymnasium's FrozenLake in a real Docker sandbox, through its text interface -> the real
reward service. Asserts on what the trajectory recorded: turns, observations, env rewards, reward and status."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from tests.conftest import running_stack
from tests.integration.test_trajectory import load_record
from trajflow.contracts.trajectory import TrajectoryStatus
from trajflow.rl.engines.scripted import ScriptedEngine

pytestmark = pytest.mark.integration

LAKE = "gym:FrozenLake-v1"
SAFE_PATH = ["down", "down", "right", "right", "down", "right"]
"""From S to G on FrozenLake-v1's 4x4 map, around its holes (worked out by hand from the map)."""


def scripted(tiny_model, replies: list[str]) -> ScriptedEngine:
    return ScriptedEngine(AutoTokenizer.from_pretrained(tiny_model), replies)


async def test_a_policy_that_walks_the_safe_path_reaches_the_goal(
    temporal_env, reward_service, store, sandbox_manager, tiny_model
) -> None:
    engine = scripted(tiny_model, [f"I go \\boxed{{{move}}}" for move in SAFE_PATH])
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as st:
        req = st.request(env_id=LAKE, seed=4, env_kwargs={"is_slippery": False}, max_turns=10)
        result = await st.run(req)
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert result.turns == 6 and result.reward == 1.0 and result.env_recoveries == 0
    record = load_record(store, result.trajectory_uri)
    assert record.first_observation.startswith("You are playing Frozen Lake.")
    assert record.first_observation.endswith("You are at row 1, column 1.\n@ F F F\nF H F H\nF F F H\nH F F G")
    assert [t.env_reward for t in record.turns] == [0.0] * 5 + [1.0]
    assert (
        record.turns[2].observation
        == "You moved right. You are at row 3, column 2.\nS F F F\nF H F H\nF @ F H\nH F F G"
    )
    assert record.turns[-1].observation.endswith(
        "You reached the goal at row 4, column 4!\nS F F F\nF H F H\nF F F H\nH F F @\n"
        "The game is over. Your reward: 1."
    )


async def test_a_slippery_lake_is_replayed_the_same_from_its_seed(
    temporal_env, reward_service, store, sandbox_manager, tiny_model
) -> None:
    """The default (slippery) lake draws its slides from the seed: two trajectories of one seed and one policy
    record the same episode, whatever it is."""
    engine = scripted(tiny_model, ["\\boxed{right}"])  # one reply: both trajectories send the same actions
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as st:
        first = await st.run(st.request(env_id=LAKE, seed=11, max_turns=12))
        second = await st.run(st.request(env_id=LAKE, seed=11, max_turns=12))
    assert first.status is second.status is TrajectoryStatus.COMPLETED, (first.error, second.error)
    one, two = load_record(store, first.trajectory_uri), load_record(store, second.trajectory_uri)
    assert [t.observation for t in one.turns] == [t.observation for t in two.turns]
    assert first.reward == second.reward and first.reward in (0.0, 1.0)
    assert "The ice is slippery" in one.first_observation


async def test_a_malformed_reply_ends_the_episode_scored_not_infra_failed(
    temporal_env, reward_service, store, sandbox_manager, tiny_model
) -> None:
    engine = scripted(tiny_model, ["\\boxed{down}", "I would rather swim."])
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as st:
        req = st.request(env_id=LAKE, seed=0, env_kwargs={"is_slippery": False}, reward_fn="success_or_penalty")
        result = await st.run(req)
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert result.turns == 2 and result.reward == pytest.approx(-0.1) and result.env_recoveries == 0
    record = load_record(store, result.trajectory_uri)
    assert [t.env_reward for t in record.turns] == [0.0, pytest.approx(-0.1)]
    assert record.turns[1].observation == (
        "At turn 2, you did not give a valid action: no action found: write your action inside \\boxed{...}. "
        "The game is over."
    )


async def test_blackjack_with_the_real_tiny_policy_completes(
    temporal_env, reward_service, store, sandbox_manager, tiny_model
) -> None:
    """The tiny random HF policy rarely writes a valid action: whatever it writes, the episode ends as the env's
    answer (a reward in {-1, 0, 1, 1.5} for a played hand, -0.1 for a malformed reply), never as an infra failure."""
    from trajflow.rl.engines.hf import HFEngine

    engine = HFEngine(tiny_model, max_batch=4, batch_wait_ms=20)
    await engine.start()
    try:
        async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as st:
            result = await st.run(st.request(env_id="gym:Blackjack-v1", seed=2, max_turns=4))
    finally:
        await engine.close()
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    record = load_record(store, result.trajectory_uri)
    assert record.first_observation.startswith("You are playing Blackjack against the dealer.")
    assert 1 <= result.turns <= 4 and result.reward == pytest.approx(sum(t.env_reward for t in record.turns))
    last = record.turns[-1]
    malformed = "did not give a valid action" in last.observation
    assert last.env_reward == pytest.approx(-0.1) if malformed else last.env_reward in (-1.0, 0.0, 1.0, 1.5)
