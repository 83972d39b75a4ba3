"""`env.close` (a fake manager; the pool's give-back runs on Docker in test_sandbox_hardening.py): a close from the
trajectory that holds the sandbox releases it, and a late repeat from one that no longer holds it, whose sandbox now
serves another trajectory, leaves it alone."""

from __future__ import annotations

from temporalio.testing import ActivityEnvironment

from trajflow.activities.env import EnvActivities
from trajflow.contracts.trajectory import EnvCloseInput, SandboxHandle
from trajflow.sandbox.leases import LeaseBook


class FakeManager:
    def __init__(self) -> None:
        self.image, self.leases, self.closed = "runtime:x", LeaseBook(), []

    def close(self, sandbox_id: str) -> None:
        self.closed.append(sandbox_id)
        self.leases.drop(sandbox_id)


HANDLE = SandboxHandle(sandbox_id="sb1", container_id="c1", host_queue="q", worker_id="w1", image="i",
                       step_timeout_s=60.0, env_id="game:GuessTheNumber-v0-easy")  # fmt: skip


async def test_a_close_acts_only_for_the_trajectory_that_holds_the_sandbox() -> None:
    manager = FakeManager()
    acts = EnvActivities(manager, "default", "w1", 60.0)  # type: ignore[arg-type]
    env = ActivityEnvironment()
    mine = env.info.workflow_id or ""
    assert mine  # the activity environment names a workflow
    manager.leases.add("sb1")
    manager.leases.grant("sb1", "another-trajectory", "run-2")
    await env.run(acts.close, EnvCloseInput(handle=HANDLE))
    assert manager.closed == []  # it serves another trajectory now
    manager.leases.grant("sb1", mine, "run-1")
    await env.run(acts.close, EnvCloseInput(handle=HANDLE))
    assert manager.closed == ["sb1"]
    await env.run(acts.close, EnvCloseInput(handle=HANDLE))  # a repeat after the close: closing is idempotent
    assert manager.closed == ["sb1", "sb1"]
