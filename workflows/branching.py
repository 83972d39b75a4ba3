"""The start of a branch (`TrajectoryRequest.branch_of`): load the parent's prefix, take the episode from it, and
check that the restored sandbox shows the parent's observation at the branch turn.

The rules of what a branch takes from its parent are in `trajflow.contracts.branches`. A refused branch (no record,
too few turns, an agent env) and a restored env whose observation differs from the parent's (the env is not
deterministic under replay) end `failed` (`EnvFault`): running it again cannot help. A store that stays
unreachable past the activity's retries ends `infra_failed`.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, CancelledError

with workflow.unsafe.imports_passed_through():
    from trajflow.contracts import names
    from trajflow.contracts.branches import BranchInput, BranchPrefix
    from trajflow.contracts.envs import EnvResetResult
    from trajflow.contracts.trajectory import TrajectoryRequest

from trajflow.workflows import stubs
from trajflow.workflows.faults import EnvFault, InfraFault


async def load_prefix(req: TrajectoryRequest) -> BranchPrefix:
    """The parent's prefix for a branch at `req.branch_turn`, its context cut and written for this run."""
    info = workflow.info()
    inp = BranchInput(
        parent=req.branch_of,
        record_uri=req.branch_record,
        turn=req.branch_turn,
        trajectory_id=f"{info.workflow_id}/{info.run_id}",
    )
    try:
        return await stubs.trajectory_branch(req.pools.reward, inp)
    except ActivityError as e:
        if isinstance(e.cause, CancelledError):
            raise
        what = f"{names.TRAJECTORY_BRANCH}: {stubs.describe(e)}"
        if stubs.error_type(e) in stubs.FATAL:
            raise EnvFault(what) from e
        raise InfraFault(what) from e


def check_restored(req: TrajectoryRequest, res: EnvResetResult, expected: str) -> None:
    """The fresh sandbox, after replaying the parent's actions 1..k-1, must show the parent's observation at turn k
    and an episode that goes on."""
    k = req.branch_turn
    if res.observation != expected:
        raise EnvFault(
            f"branch of {req.branch_of} at turn {k}: the restored env's observation at turn {k} differs from the "
            f"parent's (the env is not deterministic under replay): {res.observation[:200]!r} != {expected[:200]!r}"
        )
    if res.done:
        raise EnvFault(f"branch of {req.branch_of} at turn {k}: the parent's episode ended at turn {k - 1}")
