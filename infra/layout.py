"""The object-store layout: every key trajflow writes or reads, built here and nowhere else.

    trajectories/<workflow id>/<run id>/trajectory.json           a finished trajectory's record (reward pool)
    trajectories/<workflow id>/<run id>/context-turn007.json      what turn 7 added to the decode context (decode pool)
    runs/<run>/steps/v000003.json                                 the result of the step that made version 3
    runs/<run>/groups/g000042.json                                a sharded run's group 42: its samples' manifest
    runs/<run>/trainer/v000003/<files>, .../manifest.json         the trainer checkpoint (model + optimizer) of v3
    runs/<run>/policy/v000003/<files>, .../manifest.json          the policy weights published as v3
    runs/<run>/policy/latest.json                                 the pointer decode workers follow

A directory (checkpoint, weights) is uploaded file by file and then its `manifest.json`, so a directory is
complete once its manifest exists (`trajflow.infra.policies.put_dir`).

These keys are a storage format: runs, replays and tests read what earlier code wrote, so a change here strands
existing data (tests/unit/test_store_layout.py pins them). Keys are relative to the store's root (a local
directory or an S3 bucket and prefix, `trajflow.infra.store`). Limits: run ids are used as they are
(keys are validated by the store); trajectory ids are made safe (characters outside [A-Za-z0-9._/-] replaced).
"""

from __future__ import annotations

import re

TRAJECTORIES = "trajectories"
RUNS = "runs"
MANIFEST = "manifest.json"


def trajectory_key(trajectory_id: str, name: str) -> str:
    """`trajectories/<workflow id>/<run id>/<name>`, with characters outside [A-Za-z0-9._-/] replaced."""
    safe = re.sub(r"[^A-Za-z0-9._/-]", "_", trajectory_id).replace("..", "_").strip("/")
    return f"{TRAJECTORIES}/{safe}/{name}"


def trajectory_record_key(workflow_id: str, run_id: str) -> str:
    """Where a trajectory workflow run's record (`trajflow.contracts.records.TrajectoryRecord`) is saved."""
    return trajectory_key(f"{workflow_id}/{run_id}", "trajectory.json")


def context_key(trajectory_id: str, turn: int, attempt: int = 1) -> str:
    """Where turn `turn` stores what it added to the decode context (`trajflow.contracts.records.TurnDelta`: token ids,
    logprobs, masks); `trajectory_id` is `<workflow id>/<run id>`. A retried attempt writes its own key, so an
    earlier attempt that finishes late never overwrites the delta the workflow went on with."""
    suffix = "" if attempt <= 1 else f"-attempt{attempt}"
    return trajectory_key(trajectory_id, f"context-turn{turn:03d}{suffix}.json")


def _version(version: int) -> str:
    return f"v{version:06d}"


def step_key(run_id: str, version: int) -> str:
    """The recorded result (`TrainStepResult`) of the step that made `version`."""
    return f"{RUNS}/{run_id}/steps/{_version(version)}.json"


def group_manifest_key(run_id: str, k: int) -> str:
    """The `GroupManifest` (the samples of a complete group, `trajflow.contracts.shards`) of a sharded run's group of
    index `k`, named as the group is (`g{k:06d}`)."""
    return f"{RUNS}/{run_id}/groups/g{k:06d}.json"


def checkpoint_prefix(run_id: str, version: int) -> str:
    """The trainer checkpoint (model, optimizer, version) of `version`: a directory with a manifest."""
    return f"{RUNS}/{run_id}/trainer/{_version(version)}"


def policy_prefix(run_id: str) -> str:
    """A run's published policy weights (`.../latest.json`, `.../v000001/...`)."""
    return f"{RUNS}/{run_id}/policy"


def policy_version_prefix(run_id: str, version: int) -> str:
    """The weights published as `version`: a directory with a manifest."""
    return f"{policy_prefix(run_id)}/{_version(version)}"


def policy_latest_key(run_id: str) -> str:
    """The pointer to a run's newest published version: `{"version": 3, "weights": true}`."""
    return f"{policy_prefix(run_id)}/latest.json"


def policy_hold_key(run_id: str, version: int) -> str:
    """A hold on a published version (`PolicyStore.hold`): while it exists, pruning keeps that version."""
    return f"{policy_prefix(run_id)}/holds/{_version(version)}"


def dir_file_key(prefix: str, name: str) -> str:
    """A file of the directory uploaded under `prefix`."""
    return f"{prefix}/{name}"


def manifest_key(prefix: str) -> str:
    """The manifest of the directory uploaded under `prefix` (written last)."""
    return dir_file_key(prefix, MANIFEST)
