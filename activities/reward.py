"""Stateless activities of the reward pool: score through the reward service, save finished trajectories, and save
a sharded run's complete groups (the `GroupManifest` a shard writes before it reports the group).

Scoring is an HTTP call to the (serverless) reward service; its errors are classified once here: a rejected or
garbled answer is final, and so is a verifier that timed out on this answer (`VerifierTimedOut`: the trajectory ends
`failed`, never scored); an unreachable service is retried by Temporal. Saving assembles the trajectory record
from the turns' context deltas (`trajflow.activities.contexts`) and the workflow's summary and writes it to the store.
A group's manifest goes to the key its run and index name (`trajflow.infra.layout.group_manifest_key`), whole: a retry
writes the same bytes.
"""

from __future__ import annotations

import asyncio
import time

from temporalio import activity
from temporalio.exceptions import ApplicationError

from trajflow.activities.contexts import ContextStore
from trajflow.activities.heartbeats import QUICK_EVERY_S, with_heartbeats
from trajflow.contracts import metrics, names
from trajflow.contracts.branches import BranchInput, BranchPrefix, BranchRefused, prefix_of
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.scoring import ScoreInput, ScoreResult
from trajflow.contracts.shards import GroupManifest
from trajflow.contracts.trajectory import SaveTrajectoryInput, SaveTrajectoryResult
from trajflow.infra.layout import TRAJECTORIES, group_manifest_key, trajectory_key, trajectory_record_key
from trajflow.infra.store import ObjectStore, check_key
from trajflow.observability.metrics import record
from trajflow.rewards.client import (
    RewardClient,
    RewardRequestRejected,
    RewardServiceBadAnswer,
    RewardServiceUnavailable,
    RewardVerifierTimedOut,
)


class RewardActivities:
    def __init__(self, client: RewardClient, store: ObjectStore) -> None:
        self.client = client
        self.store = store

    @activity.defn(name=names.REWARD_SCORE)
    async def score(self, inp: ScoreInput) -> ScoreResult:
        meter = activity.metric_meter()
        started = time.monotonic()
        try:
            return await with_heartbeats(self.client.score(inp.request), "scoring", QUICK_EVERY_S)
        except RewardVerifierTimedOut as e:  # not retried, never scored: the trajectory ends failed
            record(meter, metrics.REWARD_ERRORS, 1, type=names.ERR_VERIFIER_TIMEOUT)
            raise ApplicationError(str(e), type=names.ERR_VERIFIER_TIMEOUT, non_retryable=True) from e
        except RewardRequestRejected as e:
            record(meter, metrics.REWARD_ERRORS, 1, type=names.ERR_REWARD_REJECTED)
            raise ApplicationError(str(e), type=names.ERR_REWARD_REJECTED, non_retryable=True) from e
        except RewardServiceBadAnswer as e:
            record(meter, metrics.REWARD_ERRORS, 1, type=names.ERR_REWARD_BAD_ANSWER)
            raise ApplicationError(str(e), type=names.ERR_REWARD_BAD_ANSWER, non_retryable=True) from e
        except RewardServiceUnavailable as e:
            record(meter, metrics.REWARD_ERRORS, 1, type=names.ERR_REWARD_UNAVAILABLE)
            raise ApplicationError(str(e), type=names.ERR_REWARD_UNAVAILABLE) from e
        finally:
            record(meter, metrics.REWARD_SECONDS, time.monotonic() - started)

    @activity.defn(name=names.TRAJECTORY_SAVE)
    async def save(self, inp: SaveTrajectoryInput) -> SaveTrajectoryResult:
        return await with_heartbeats(self._save(inp), "saving", QUICK_EVERY_S)

    async def _save(self, inp: SaveTrajectoryInput) -> SaveTrajectoryResult:
        context = None
        if inp.context_uri:
            # no cache: the reward pool is stateless, and each trajectory is saved once
            context = await asyncio.to_thread(ContextStore(self.store, max_cached_tokens=0).load, inp.context_uri)
        record = TrajectoryRecord(
            workflow_id=inp.workflow_id,
            request=inp.request,
            status=inp.status,
            reward=inp.reward,
            reward_details=inp.reward_details,
            first_observation=inp.first_observation,
            turns=inp.turns,
            context=context,
            env_recoveries=inp.env_recoveries,
            error=inp.error,
            timings=inp.timings,
            context_full=inp.context_full,
        )
        info = activity.info()
        # a standalone activity has no run to file it under
        if info.workflow_id is None or info.workflow_run_id is None:
            raise ApplicationError(
                f"{names.TRAJECTORY_SAVE} saves a trajectory workflow's record; it was not started by a workflow",
                type=names.ERR_BAD_REQUEST,
                non_retryable=True,
            )
        key = trajectory_record_key(info.workflow_id, info.workflow_run_id)
        uri = await asyncio.to_thread(self.store.put_json, key, record)
        return SaveTrajectoryResult(trajectory_uri=uri)

    @activity.defn(name=names.TRAJECTORY_BRANCH)
    async def branch(self, inp: BranchInput) -> BranchPrefix:
        """A branch's start: its parent's prefix, with the parent's context cut at turn k-1 written for it.
        Refusals (no record, too few turns, ...) are non-retryable `BadRequest`s: the branch ends `failed`."""
        try:
            return await with_heartbeats(asyncio.to_thread(self._branch, inp), "branching", QUICK_EVERY_S)
        except BranchRefused as e:
            raise ApplicationError(
                f"cannot branch {inp.parent} at turn {inp.turn}: {e}", type=names.ERR_BAD_REQUEST, non_retryable=True
            ) from e

    def _branch(self, inp: BranchInput) -> BranchPrefix:
        uri = inp.record_uri or self._only_record(inp.parent)
        if not self.store.exists(uri):
            raise BranchRefused(f"no record at {uri}")
        record = TrajectoryRecord.model_validate(self.store.get_json(uri))
        prefix, context = prefix_of(record, inp.turn, uri)
        if context is not None:  # a whole TurnContext: `ContextStore.load` reads it as the start of the chain
            key = trajectory_key(inp.trajectory_id, "context-branch.json")
            prefix = prefix.model_copy(update={"context_uri": self.store.put_json(key, context)})
        return prefix

    def _only_record(self, workflow_id: str) -> str:
        """The one record saved under `workflow_id` (any run); several runs (a reset) must be told apart by URI."""
        prefix = trajectory_key(workflow_id, "").rstrip("/") + "/"
        found = [u for u in self.store.list(prefix) if u.endswith("/trajectory.json")]
        if not found:
            raise BranchRefused(f"no trajectory record under {TRAJECTORIES}/ for workflow {workflow_id!r}")
        if len(found) > 1:
            raise BranchRefused(f"{workflow_id} has {len(found)} runs' records: give branch_record, one of {found}")
        return found[0]

    @activity.defn(name=names.GROUP_SAVE)
    async def save_group(self, manifest: GroupManifest) -> str:
        """Write a complete group's manifest where the trainer reads it; returns its URI."""
        key = group_manifest_key(manifest.run_id, manifest.k)
        try:
            check_key(key)
        except ValueError as e:  # a run id no key can hold: retrying cannot fix it
            raise ApplicationError(f"{names.GROUP_SAVE}: {e}", type=names.ERR_BAD_REQUEST, non_retryable=True) from e
        return await with_heartbeats(asyncio.to_thread(self.store.put_json, key, manifest), "saving", QUICK_EVERY_S)
