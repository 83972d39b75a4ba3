"""`trajflow eval` as a user runs it, on the stack `trajflow up` started (tiny model): the base model, then a
published version of a short run pinned while a newer one exists, with the JSON and the recorded versions
checked; and the errors for a run or version that is not in the store and for a stack that is not up."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.conftest import ROOT, free_port
from trajflow.contracts.records import TrajectoryRecord

pytestmark = pytest.mark.integration

SMOKE = ROOT / "trajflow" / "configs" / "smoke.toml"


def _records(cli_stack, pattern: str) -> list[TrajectoryRecord]:
    root = cli_stack.state_dir / "store" / "trajectories"
    return [TrajectoryRecord.model_validate_json(p.read_text()) for p in root.glob(f"{pattern}/*/trajectory.json")]


def test_eval_of_the_base_model_and_of_a_pinned_version(cli_stack, tmp_path) -> None:
    out = tmp_path / "base.json"
    proc = cli_stack.trajflow("eval", str(SMOKE), "--episodes", "3", "--samples", "2", "--json", str(out), timeout=300)
    base = json.loads(out.read_text())
    assert (base["policy"], base["version"], base["episodes"], base["samples"]) == ("", 0, 3, 2)
    assert base["temperature"] == 1.0 and set(base["pass_at_k"]) == {"1", "2"}
    assert [row["seed"] for row in base["per_episode"]] == [1_000_000, 1_000_001, 1_000_002]  # [train.eval] seeds
    assert all(len(row["sample_rewards"]) == 2 and row["task"] == "guess-the-number" for row in base["per_episode"])
    assert base["scored"] + base["not_completed"] == 3
    assert "9/9 trajectories done" in proc.stderr  # progress: 3 seeds x (greedy + 2 samples)
    assert proc.stdout.splitlines()[0].split()[:5] == ["SEED", "TASK", "GREEDY", "REWARD", "WIN"]
    base_records = _records(cli_stack, "eval-*-base-v0-*")
    assert len(base_records) == 9 and all(t.policy_version == 0 for r in base_records for t in r.turns)

    # a short run publishes v1..v3 (the trainer keeps v2 and v3); v2 is evaluated while v3 is the newest
    run_id = f"eval-run-{uuid.uuid4().hex[:6]}"
    trained = cli_stack.trajflow("train", str(SMOKE), "--run-id", run_id, "--no-eval", timeout=600)
    # without --json, stdout is the verdict line alone (the summary is in the run dir; progress went to stderr)
    [verdict] = trained.stdout.splitlines()
    assert verdict.startswith(f"run {run_id}: 3 steps in ") and "(not evaluated)" in verdict, trained.stdout
    out = tmp_path / "v2.json"
    cli_stack.trajflow("eval", str(SMOKE), "--policy", f"{run_id}@2", "--episodes", "2", "--samples", "1",
                       "--json", str(out), timeout=300)  # fmt: skip
    pinned = json.loads(out.read_text())
    assert (pinned["policy"], pinned["version"], len(pinned["per_episode"])) == (run_id, 2, 2)
    records = _records(cli_stack, f"eval-*-{run_id}-v2-*")
    assert len(records) == 4
    assert {t.policy_version for r in records for t in r.turns} == {2}  # exactly v2, though v3 is published
    assert all(r.context is not None and set(r.context.turn_versions) == {2} for r in records)

    newest = cli_stack.trajflow("eval", str(SMOKE), "--policy", run_id, "--episodes", "1", timeout=300)
    assert f"eval {run_id} v3: success" in newest.stdout
    assert {t.policy_version for r in _records(cli_stack, f"eval-*-{run_id}-v3-*") for t in r.turns} == {3}

    # versions and runs that are not in the store: exit 2, saying what is
    gone = cli_stack.trajflow("eval", str(SMOKE), "--policy", f"{run_id}@1", check=False)
    assert gone.returncode == 2 and "the versions still there are v2, v3" in gone.stderr
    unknown = cli_stack.trajflow("eval", str(SMOKE), "--policy", "no-such-run", check=False)
    assert unknown.returncode == 2 and "runs that have:" in unknown.stderr and run_id in unknown.stderr


def test_eval_says_when_the_stack_is_not_up(cli_stack, tmp_path) -> None:
    # no Temporal server at the address
    env = {**cli_stack.env, "TRAJFLOW_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}"}
    import subprocess
    import sys
    from pathlib import Path

    trajflow = str(Path(sys.executable).parent / "trajflow")
    proc = subprocess.run([trajflow, "eval", str(SMOKE), "--episodes", "1"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1 and "the stack is not up" in proc.stderr and "trajflow up -c" in proc.stderr
    # the server is up but no worker serves the config's pools
    config = tmp_path / "elsewhere.toml"
    config.write_text(
        SMOKE.read_text().replace("[[tasks]]", '[pools]\ndecode = ["nobody"]\n\n[[tasks]]')
        + '\n[tasks.pools]\ndecode = "nobody"\n'
    )
    idle = cli_stack.trajflow("eval", str(config), "--episodes", "1", check=False, timeout=120)
    assert idle.returncode == 1 and "no worker polls trajflow-decode-nobody" in idle.stderr, idle.stderr
