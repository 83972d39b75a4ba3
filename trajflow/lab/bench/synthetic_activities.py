"""Synthetic env activities: the env pool's contract (`env.reset` / `env.step` / `env.close`, same names and
models as `trajflow.activities.env`) served by `trajflow.lab.bench.synthetic_env` episodes held in this worker's memory,
no Docker.

The unchanged TrajectoryWorkflow runs on them: `env.reset` answers with a handle naming this worker's host
queue, and the steps of that episode come back here. A step sleeps its drawn delay (units · `unit_s`) and
honours cancellation, heartbeating every few seconds as the real step does. Replayed actions after a lost sandbox
are applied without sleeping.

Not covered: a worker restart loses its episodes (the next step fails as `SandboxLost` and the workflow
restores a fresh episode by replay, as with a real sandbox); `env.reset` itself takes no simulated time.
"""

from __future__ import annotations

import asyncio
import uuid

from temporalio import activity
from temporalio.exceptions import ApplicationError

from trajflow.activities.heartbeats import QUICK_EVERY_S, with_heartbeats
from trajflow.contracts import names
from trajflow.contracts.trajectory import (
    EnvCloseInput,
    EnvResetInput,
    EnvResetResult,
    EnvStepInput,
    EnvStepResult,
    SandboxHandle,
)
from trajflow.lab.bench.synthetic_env import ENV_ID, SyntheticEpisode, SyntheticSpec, SyntheticStep, episode_seed

IMAGE = "synthetic"
"""What the handle reports as the sandbox image: there is none."""


class SyntheticEnvActivities:
    """The env activities of one pool on one synthetic env worker."""

    def __init__(self, pool: str, worker_id: str, unit_s: float, step_timeout_s: float = 600.0) -> None:
        self.pool = pool
        self.worker_id = worker_id
        self.host_queue = names.env_host_queue(pool, worker_id)
        self.unit_s = unit_s
        self.step_timeout_s = step_timeout_s
        self.episodes: dict[str, SyntheticEpisode] = {}

    @activity.defn(name=names.ENV_RESET)
    async def reset(self, inp: EnvResetInput) -> EnvResetResult:
        if inp.env_id != ENV_ID:
            raise ApplicationError(
                f"this env pool serves only {ENV_ID!r}, not {inp.env_id!r}",
                type=names.ERR_BAD_REQUEST,
                non_retryable=True,
            )
        try:
            spec = SyntheticSpec.from_kwargs(inp.env_kwargs)
        except (ValueError, TypeError) as e:
            raise ApplicationError(str(e), type=names.ERR_ENV, non_retryable=True) from e
        episode = SyntheticEpisode(spec, episode_seed(inp.seed, inp.trajectory_id))
        observation = episode.reset()
        for action in inp.replay_actions:
            observation = episode.step(action).observation
        sandbox_id = f"syn-{uuid.uuid4().hex[:12]}"
        self.episodes[sandbox_id] = episode
        handle = SandboxHandle(
            sandbox_id=sandbox_id,
            container_id=sandbox_id,
            host_queue=self.host_queue,
            worker_id=self.worker_id,
            image=IMAGE,
            step_timeout_s=self.step_timeout_s,
        )
        return EnvResetResult(
            handle=handle, observation=observation, replayed=len(inp.replay_actions), done=episode.done
        )

    @activity.defn(name=names.ENV_STEP)
    async def step(self, inp: EnvStepInput) -> EnvStepResult:
        episode = self.episodes.get(inp.handle.sandbox_id)
        if episode is None:
            raise ApplicationError(
                f"no synthetic episode {inp.handle.sandbox_id} on {self.worker_id}",
                type=names.ERR_SANDBOX_LOST,
                non_retryable=True,
            )
        try:
            out: SyntheticStep = episode.step(inp.action)
        except ValueError as e:
            raise ApplicationError(str(e), type=names.ERR_ENV, non_retryable=True) from e
        # heartbeating as the real env step does: its 15-s heartbeat timeout would take a longer step for a lost sandbox
        await with_heartbeats(asyncio.sleep(out.delay_units * self.unit_s), "synthetic step", QUICK_EVERY_S)
        return EnvStepResult(
            observation=out.observation,
            reward=out.reward,
            terminated=out.terminated,
            truncated=False,
            info={"turn": episode.turn, "turns": episode.turns},
        )

    @activity.defn(name=names.ENV_CLOSE)
    async def close(self, inp: EnvCloseInput) -> None:
        self.episodes.pop(inp.handle.sandbox_id, None)
