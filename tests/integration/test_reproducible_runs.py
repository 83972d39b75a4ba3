"""Reproducible runs: `trajflow train` twice on the smoke config with the same seed, in the mode where that is a
guarantee (sync: α = 0 with the batch barrier, and no redundancy, so every member of every group is trained on
whatever order they finish in), gives the same rewards per step, and under them the same sampled tokens for every
trajectory, though the decode worker batches the requests differently each time. The run directory keeps the
resolved config.

The tiny random policy wins no game, so its rewards alone would be equal by accident; the tokens are what can
differ: they come from each trajectory's own seed (run seed, group, member, turn), through the weights each step
trains from those tokens."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT
from trajflow.contracts.config import RunConfig, load_run_config
from trajflow.contracts.records import TrajectoryRecord

pytestmark = pytest.mark.integration

LOSS_TOL = 1e-4
"""The rollout logprobs the loss reads come from differently composed batches (left padding, batch size): equal to
~1e-6 in float32, so the loss is too, not bitwise."""


def test_two_sync_runs_with_the_same_seed_sample_the_same_tokens_and_rewards(cli_stack, tmp_path) -> None:
    config = tmp_path / "smoke-reproducible.toml"
    config.write_text(
        (ROOT / "trajflow" / "configs" / "smoke.toml").read_text().replace("redundancy = 1", "redundancy = 0")
    )
    summaries, tokens = {}, {}
    for run_id in ("repro-a", "repro-b"):
        out = tmp_path / f"{run_id}.json"
        cli_stack.trajflow("train", str(config), "--sync", "--seed", "7", "--no-eval", "--run-id", run_id,
                           "--json-summary", str(out), timeout=600)  # fmt: skip
        summaries[run_id] = json.loads(out.read_text())
        tokens[run_id] = _sampled_tokens(cli_stack.state_dir, run_id)

    a, b = summaries["repro-a"], summaries["repro-b"]
    assert a["steps"] == b["steps"] == 3 and a["trajectories_trained"] == b["trajectories_trained"] == 24
    assert a["counters"]["failed"] == a["counters"]["infra_failed"] == 0  # a failure would change the batches
    assert a["reward_by_step"] == b["reward_by_step"]
    # every trajectory, keyed by (group, member), sampled the same tokens in both runs
    assert len(tokens["repro-a"]) == 24 and tokens["repro-a"] == tokens["repro-b"]
    # ... and each member its own: the seeds differ within a group
    groups = {}
    for (group, _), ids in tokens["repro-a"].items():
        groups.setdefault(group, set()).add(ids)
    assert all(len(samples) == 4 for samples in groups.values())
    # the trainer saw the same batches in the same order
    steps = {run: _step_records(cli_stack.state_dir, run) for run in summaries}
    for ra, rb in zip(steps["repro-a"], steps["repro-b"], strict=True):
        assert abs(ra["metrics"]["loss"] - rb["metrics"]["loss"]) < LOSS_TOL

    # the resolved config: the whole RunConfig as it ran, overrides applied and defaults filled in
    resolved = RunConfig.model_validate_json((cli_stack.state_dir / "runs" / "repro-a" / "config.json").read_text())
    given = load_run_config(config)
    assert resolved.train == given.train.model_copy(update={"sync": True, "alpha": 0, "seed": 7})
    assert (resolved.model, resolved.tasks, resolved.pools, resolved.hardware) == (
        given.model, given.tasks, given.pools, given.hardware,
    )  # fmt: skip


def _sampled_tokens(state_dir, run_id: str) -> dict[tuple[str, str], tuple[int, ...]]:
    """Each trained trajectory's whole context (prompts, observations, completions), keyed by group and member."""
    out = {}
    for path in (state_dir / "store" / "trajectories").glob(f"{run_id}-g*/*/trajectory.json"):
        record = TrajectoryRecord.model_validate_json(path.read_text())
        assert record.context is not None
        group, member = record.workflow_id.removeprefix(f"{run_id}-").rsplit("-", 1)
        out[(group, member)] = tuple(record.context.token_ids)
    return out


def _step_records(state_dir, run_id: str) -> list[dict]:
    steps = sorted((state_dir / "store" / "runs" / run_id / "steps").glob("v*.json"))
    return [json.loads(p.read_text()) for p in steps]
