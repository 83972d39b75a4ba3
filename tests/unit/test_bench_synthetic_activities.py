"""trajflow.lab.bench.synthetic_activities: the env pool's contract served without Docker (run in temporalio's
ActivityEnvironment, no server): handles name this worker's host queue, the env decides the episode's length,
errors carry the same types as the real env's."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from trajflow.contracts import names
from trajflow.contracts.trajectory import EnvCloseInput, EnvResetInput, EnvStepInput
from trajflow.lab.bench.synthetic_activities import SyntheticEnvActivities
from trajflow.lab.bench.synthetic_env import ENV_ID, SyntheticEpisode, SyntheticSpec, episode_seed


def _reset_input(**fields: object) -> EnvResetInput:
    base: dict[str, object] = {
        "trajectory_id": "traj-1",
        "env_id": ENV_ID,
        "seed": 9,
        "env_kwargs": {"mean": 1.0, "sigma": 1.0},
    }
    return EnvResetInput.model_validate(base | fields)


async def test_an_episode_runs_to_the_end_its_env_chose() -> None:
    acts = SyntheticEnvActivities("p", "w1", unit_s=0.0001)
    env = ActivityEnvironment()
    res = await env.run(acts.reset, _reset_input())
    assert res.handle.host_queue == names.env_host_queue("p", "w1") and res.handle.worker_id == "w1"
    expected = SyntheticEpisode(SyntheticSpec(mean=1.0, sigma=1.0), episode_seed(9, "traj-1")).turns
    steps = [await env.run(acts.step, EnvStepInput(handle=res.handle, action="a")) for _ in range(expected)]
    assert [s.terminated for s in steps] == [False] * (expected - 1) + [True]
    with pytest.raises(ApplicationError) as over:
        await env.run(acts.step, EnvStepInput(handle=res.handle, action="a"))
    assert over.value.type == names.ERR_ENV
    await env.run(acts.close, EnvCloseInput(handle=res.handle))
    assert acts.episodes == {}


async def test_replayed_actions_restore_the_episode() -> None:
    acts = SyntheticEnvActivities("p", "w1", unit_s=0.0001)
    env = ActivityEnvironment()
    turns = SyntheticEpisode(SyntheticSpec(mean=1.0, sigma=1.0), episode_seed(9, "traj-1")).turns
    res = await env.run(acts.reset, _reset_input(replay_actions=["a"] * turns))
    assert res.replayed == turns and res.done


async def test_a_lost_episode_and_bad_requests_have_the_real_envs_error_types() -> None:
    acts = SyntheticEnvActivities("p", "w1", unit_s=0.0001)
    env = ActivityEnvironment()
    res = await env.run(acts.reset, _reset_input())
    acts.episodes.clear()  # as after a worker restart
    with pytest.raises(ApplicationError) as lost:
        await env.run(acts.step, EnvStepInput(handle=res.handle, action="a"))
    assert lost.value.type == names.ERR_SANDBOX_LOST and lost.value.non_retryable
    with pytest.raises(ApplicationError) as wrong_env:
        await env.run(acts.reset, _reset_input(env_id="game:GuessTheNumber-v0-easy"))
    assert wrong_env.value.type == names.ERR_BAD_REQUEST
    with pytest.raises(ApplicationError) as typo:
        await env.run(acts.reset, _reset_input(env_kwargs={"sigam": 1.0}))
    assert typo.value.type == names.ERR_ENV
