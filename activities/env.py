"""Env activities: reset, step and close sandboxes held by this env worker.

`env.reset` runs on the pool's shared queue: it finds (or builds, on first use) the env's image, takes a started
sandbox from the warm pool (or starts one), and answers with a handle naming this worker's own host queue;
`env.step` and `env.close` run there; the close gives the sandbox back to the warm pool, which keeps it for the
next trajectory of a reusable env (`trajflow.sandbox.pool`) or removes it (a late repeat of a close, from a
trajectory that no longer holds the sandbox, does nothing). Sandbox calls are blocking (docker SDK, a Unix socket)
and run in threads. Every activity on a sandbox renews its lease (`trajflow.sandbox.leases`): the reset grants it to the
calling workflow run, and the sandbox counts as busy while a request is in flight, so the env worker's sweep
(`workers/sandbox_sweep.py`) never removes a sandbox in use. Failures are classified once: infra (`SandboxLost`, start
errors) vs the env's own (`EnvError`, which includes an unknown env id and a non-finite reward; an `agent:` env's
program failure is `AgentError` with its kind, one restored by replay that asks something else than its record is
`AgentNonDeterministic`). Observations are cut to `MAX_OBSERVATION_CHARS` with a marker, except an `agent:` env's
(its chat request as JSON: whole, or an error past `MAX_AGENT_REQUEST_CHARS`); an agent env's reset and steps may
take its budget plus a margin (`trajflow.sandbox.agents`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from trajflow.activities.heartbeats import QUICK_EVERY_S, with_heartbeats
from trajflow.contracts import metrics, names
from trajflow.contracts.agent import is_agent
from trajflow.contracts.limits import ENV_ID_HELP, MAX_OBSERVATION_CHARS
from trajflow.contracts.trajectory import (
    EnvCloseInput,
    EnvResetInput,
    EnvResetResult,
    EnvStepInput,
    EnvStepResult,
    SandboxHandle,
)
from trajflow.envs.formatting import cap_observation, observation_message
from trajflow.observability.metrics import record
from trajflow.sandbox.agents import agent_observation, call_timeout_s, check_replayed
from trajflow.sandbox.errors import (
    AgentDiverged,
    EnvError,
    SandboxError,
    SandboxLost,
    SandboxStartError,
    SandboxStepTimeout,
)
from trajflow.sandbox.images import ImageResolver, UnknownTask
from trajflow.sandbox.manager import SandboxManager
from trajflow.sandbox.pool import WarmPool

T = TypeVar("T")
RESET_HEARTBEAT_EVERY_S = 5.0
"""Below a third of env.reset's heartbeat timeout (workflows/stubs.py)."""


class EnvActivities:
    """The env activities of one pool on one env worker; the sandbox manager is shared across pools."""

    def __init__(
        self,
        manager: SandboxManager,
        pool: str,
        worker_id: str,
        step_timeout_s: float,
        warm: WarmPool | None = None,
        images: ImageResolver | None = None,
    ) -> None:
        self.manager = manager
        self.warm = warm
        self.images = images
        self.pool = pool
        self.worker_id = worker_id
        self.host_queue = names.env_host_queue(pool, worker_id)
        self.step_timeout_s = step_timeout_s

    @activity.defn(name=names.ENV_RESET)
    async def reset(self, inp: EnvResetInput) -> EnvResetResult:
        # Heartbeats all along (an image build or a container start can take a while), so a reset on a worker
        # that dies is retried elsewhere after the heartbeat timeout, not after start-to-close.
        started = time.monotonic()
        result, hit = await with_heartbeats(self._reset(inp), "resetting", RESET_HEARTBEAT_EVERY_S)
        meter = activity.metric_meter()
        record(meter, metrics.SANDBOX_RESET_SECONDS, time.monotonic() - started, hit=str(hit).lower())
        record(meter, metrics.WARM_POOL_TAKES, 1, hit=str(hit).lower())
        return result

    async def _reset(self, inp: EnvResetInput) -> tuple[EnvResetResult, bool]:
        """The reset, and whether its sandbox came from the warm pool."""
        image = self.manager.image
        if self.images is not None:
            activity.heartbeat("finding or building the image")
            image = await _guarded(lambda: self.images.image_for(inp.env_id, inp.env_package))  # type: ignore[union-attr]
        if self.warm is not None:
            warm = self.warm
            box, hit = await _guarded(lambda: warm.take_noting_hit(inp.env_id, image))
        else:
            box, hit = await _guarded(lambda: self.manager.start(inp.env_id, image)), False
        info = activity.info()
        self.manager.leases.grant(box.id, info.workflow_id or "", info.workflow_run_id or "")
        env_id, expect = inp.env_id, inp.expect_digests
        step_timeout_s = call_timeout_s(env_id, inp.env_kwargs, self.step_timeout_s)
        timeout = {"timeout_s": step_timeout_s} if is_agent(env_id) else {}  # else: the manager's own

        def replay(i: int, action: str) -> EnvStepResult:
            step = _step_result(box.step(action, **timeout), env_id)
            if expect:
                check_replayed(i + 1, expect[i], step.observation)
            return step

        try:
            with self.manager.leases.in_use(box.id):
                observation = await _guarded(
                    lambda: _observation(box.reset(env_id, inp.seed, dict(inp.env_kwargs), **timeout), env_id)
                )
                done = False
                for i, action in enumerate(inp.replay_actions):
                    activity.heartbeat(f"replaying action {i + 1}/{len(inp.replay_actions)}")
                    step = await _guarded(lambda i=i, a=action: replay(i, a))
                    observation, done = step.observation, step.terminated or step.truncated
        except BaseException:
            await asyncio.to_thread(self.manager.close, box.id)
            raise
        handle = SandboxHandle(
            sandbox_id=box.id,
            container_id=box.container_id,
            host_queue=self.host_queue,
            worker_id=self.worker_id,
            image=image,
            step_timeout_s=step_timeout_s,
            env_id=env_id,
        )
        result = EnvResetResult(handle=handle, observation=observation, replayed=len(inp.replay_actions), done=done)
        return result, hit

    @activity.defn(name=names.ENV_STEP)
    async def step(self, inp: EnvStepInput) -> EnvStepResult:
        handle = inp.handle
        timeout = {"timeout_s": handle.step_timeout_s} if is_agent(handle.env_id) else {}  # set at reset

        def run() -> EnvStepResult:
            with self.manager.leases.in_use(handle.sandbox_id):
                out = self.manager.get(handle.sandbox_id).step(inp.action, **timeout)
            return _step_result(out, handle.env_id)

        return await with_heartbeats(_guarded(run), "stepping", QUICK_EVERY_S)

    @activity.defn(name=names.ENV_CLOSE)
    async def close(self, inp: EnvCloseInput) -> None:
        sandbox_id = inp.handle.sandbox_id
        holder = self.manager.leases.holder(sandbox_id)
        if holder and holder != activity.info().workflow_id:
            return  # a late repeat of a close: the sandbox went back to the pool and serves another trajectory now
        release = self.warm.give_back if self.warm is not None else self.manager.close
        await with_heartbeats(asyncio.to_thread(release, sandbox_id), "closing", QUICK_EVERY_S)


def _observation(out: Mapping[str, Any], env_id: str) -> str:
    """The runner's observation as the next user message, cut to MAX_OBSERVATION_CHARS (an agent that printed
    10 MB must not push an activity result over Temporal's payload limit); an `agent:` env's chat request whole, as
    the runner wrote it (no info suffix: its timing must not enter what a replay compares)."""
    if is_agent(env_id):
        return agent_observation(out["observation"])
    return cap_observation(observation_message(out["observation"], out.get("info") or {}), MAX_OBSERVATION_CHARS)


def _step_result(out: Mapping[str, Any], env_id: str = "") -> EnvStepResult:
    reward = float(out["reward"])
    if not math.isfinite(reward):  # would poison the reward and the advantages: the env is broken, not infra
        raise ApplicationError(
            f"the env answered a step with a non-finite reward ({reward})", type=names.ERR_ENV, non_retryable=True
        )
    return EnvStepResult(
        observation=_observation(out, env_id),
        reward=reward,
        terminated=bool(out["terminated"]),
        truncated=bool(out["truncated"]),
        info=out.get("info") or {},
    )


async def _guarded(fn: Callable[[], T]) -> T:
    """Run a blocking sandbox call in a thread and map sandbox errors to named activity errors."""
    try:
        return await asyncio.to_thread(fn)
    except EnvError as e:
        if e.kind == "AgentError":
            kind = e.agent_kind or "failed"
            message = e.message if e.message.startswith("agent ") else f"agent {kind}: {e.message}"
            raise ApplicationError(message, {"agent_kind": kind}, type=names.ERR_AGENT, non_retryable=True) from e
        hint = f"; an env id is {ENV_ID_HELP}" if e.kind == "UnknownEnv" else ""
        raise ApplicationError(f"{e}{hint}", type=names.ERR_ENV, non_retryable=True) from e
    except AgentDiverged as e:
        raise ApplicationError(str(e), type=names.ERR_AGENT_NONDETERMINISTIC, non_retryable=True) from e
    except UnknownTask as e:  # a `shell:` env id naming no shipped task, a `py:`/`agent:` env without its package
        raise ApplicationError(str(e), type=names.ERR_ENV, non_retryable=True) from e
    except (SandboxLost, SandboxStepTimeout) as e:
        # Retrying on a dead sandbox cannot help: the workflow restores a fresh one by replay.
        raise ApplicationError(str(e), type=names.ERR_SANDBOX_LOST, non_retryable=True) from e
    except SandboxStartError as e:
        raise ApplicationError(str(e), type=names.ERR_SANDBOX_START) from e
    except SandboxError as e:
        raise ApplicationError(str(e), type=type(e).__name__) from e
