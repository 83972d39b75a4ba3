"""ReplayEnvWorkflow: re-drive a fresh sandbox with a trajectory's recorded actions, no LLM (`replay --env-only`).

It calls the same activities, by name and with the same options (`trajflow.workflows.stubs`), as a TrajectoryWorkflow:
`env.reset` on the env pool's shared queue (so the env worker resolves the image, takes a warm sandbox and
applies its limits exactly as it did for the original), then each recorded action with `env.step` on that
sandbox's host queue, then `env.close`. What the sandbox answers is kept step by step and answered by the
`progress` query while it runs, so a CLI can print observations as they come.

Limits: no recovery. A failed reset or step ends the replay with `error` set (that failure is what a user wants
to see when reproducing an env bug); the sandbox is closed either way. Actions after the episode ended are not
sent.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from trajflow.contracts import names
    from trajflow.contracts.replay import EnvReplayInput, EnvReplayResult, EnvReplayStep
    from trajflow.contracts.trajectory import EnvResetInput, SandboxHandle

from trajflow.workflows import attributes as keys
from trajflow.workflows import stubs


@workflow.defn(name=names.REPLAY_ENV_WORKFLOW)
class ReplayEnvWorkflow:
    @workflow.init
    def __init__(self, inp: EnvReplayInput) -> None:
        self.first_observation = ""
        self.steps: list[EnvReplayStep] = []
        self.error: str | None = None
        self.handle: SandboxHandle | None = None
        """The open sandbox (None once closed)."""
        self.opened: SandboxHandle | None = None
        """The sandbox this replay ran in, kept for the result."""
        self.done = False

    @workflow.run
    async def run(self, inp: EnvReplayInput) -> EnvReplayResult:
        updates = [keys.SA_ENV.value_set(inp.env_id)]
        if inp.replay_of:
            updates.append(keys.SA_REPLAY_OF.value_set(inp.replay_of))
        workflow.upsert_search_attributes(updates)
        try:
            await self._drive(inp)
        finally:
            await self._close()
        self.done = True
        return self.progress()

    async def _drive(self, inp: EnvReplayInput) -> None:
        try:
            res = await stubs.env_reset(
                inp.env_pool,
                EnvResetInput(
                    trajectory_id=workflow.info().workflow_id,
                    env_id=inp.env_id,
                    seed=inp.seed,
                    env_kwargs=inp.env_kwargs,
                    env_package=inp.env_package,
                ),
            )
        except ActivityError as e:
            self.error = f"env.reset: {stubs.describe(e)}"
            return
        handle = self.handle = self.opened = res.handle
        self.first_observation = res.observation
        for i, action in enumerate(inp.actions):
            try:
                step = await stubs.env_step(handle, action, timedelta(seconds=handle.step_timeout_s))
            except ActivityError as e:
                self.error = f"env.step {i + 1}: {stubs.describe(e)}"
                return
            self.steps.append(
                EnvReplayStep(
                    action=action,
                    observation=step.observation,
                    reward=step.reward,
                    terminated=step.terminated,
                    truncated=step.truncated,
                    info=step.info,
                )
            )
            if step.terminated or step.truncated:
                return

    async def _close(self) -> None:
        handle, self.handle = self.handle, None
        if handle is None:
            return
        try:
            await stubs.env_close(handle)
        except ActivityError as e:  # the reaper removes what a dead host left behind
            workflow.logger.warning("closing sandbox %s failed: %s", handle.sandbox_id, stubs.describe(e))

    @workflow.query(name=names.QUERY_PROGRESS)
    def progress(self) -> EnvReplayResult:
        """The steps answered so far (all of them once `done`)."""
        handle = self.opened
        return EnvReplayResult(
            first_observation=self.first_observation,
            steps=list(self.steps),
            error=self.error,
            sandbox_id=handle.sandbox_id if handle else "",
            worker_id=handle.worker_id if handle else "",
            image=handle.image if handle else "",
            done=self.done,
        )
