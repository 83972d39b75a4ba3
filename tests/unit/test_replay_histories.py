"""The workflow histories checked in under trajflow/cli/replay/histories/ replay against the current workflow code
(Temporal's Replayer, offline: no server), so a change that makes a workflow non-deterministic for what those runs went
through fails here, in CI, before it meets running workflows. Refresh them deliberately with
tests/integration/test_record_histories.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.common import RawValue

from trajflow.cli.replay.check import HISTORIES_DIR, check, history_files, load_history
from trajflow.workflows.inputs import NO_INPUT
from trajflow.workflows.replay_env import ReplayEnvWorkflow
from trajflow.workflows.training import TrainingWorkflow
from trajflow.workflows.trajectory import TrajectoryWorkflow

ROOT = Path(__file__).resolve().parents[2]
HISTORIES = sorted(HISTORIES_DIR.glob("*.json"))
EXPECTED = {
    "trajectory-completed": "TrajectoryWorkflow",
    "trajectory-infra-failed": "TrajectoryWorkflow",
    "trajectory-reset": "TrajectoryWorkflow",
    "trajectory-branch": "TrajectoryWorkflow",
    "replay-env": "ReplayEnvWorkflow",
    "training-continued": "TrainingWorkflow",
    "training-resumed": "TrainingWorkflow",
    "training-tree": "TrainingWorkflow",
}


def test_the_recorded_histories_are_all_there() -> None:
    assert {p.stem for p in HISTORIES} >= EXPECTED.keys()


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays_deterministically(path: Path) -> None:
    [result] = await check([(str(path), load_history(path))])
    assert result.error is None, result.error
    assert result.workflow_type == EXPECTED.get(path.stem, result.workflow_type)


@workflow.defn(name="TrajectoryWorkflow", sandboxed=False)  # the sandbox would re-import this test module
class ReorderedTrajectoryWorkflow(TrajectoryWorkflow):
    """A deliberately non-deterministic change: a timer before anything else, so every recorded command shifts."""

    @workflow.run
    async def run(self, raw: RawValue = NO_INPUT) -> object:
        await workflow.sleep(1)
        return await super().run(raw)


async def test_a_non_deterministic_change_is_caught() -> None:
    paths = [HISTORIES_DIR / "trajectory-completed.json", HISTORIES_DIR / "training-resumed.json"]
    changed, same = await check(
        [(str(p), load_history(p)) for p in paths], [ReorderedTrajectoryWorkflow, TrainingWorkflow, ReplayEnvWorkflow]
    )
    assert changed.error is not None and "Nondeterminism" in changed.error, changed
    assert same.error is None  # the other workflow's history still replays


def test_targets_are_files_folders_or_workflow_ids(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{}")
    files, ids = history_files([str(tmp_path), "traj-abc", "missing.json"])
    assert files == [tmp_path / "a.json", Path("missing.json")] and ids == ["traj-abc"]
    assert history_files([])[0] == HISTORIES


def test_cli_check_exits_nonzero_on_a_bad_history(tmp_path: Path) -> None:
    trajflow = str(Path(sys.executable).parent / "trajflow")
    ok = subprocess.run([trajflow, "replay", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"{len(HISTORIES)}/{len(HISTORIES)} histories replay deterministically" in ok.stdout
    # a history whose first workflow task issued other commands than the code does now: swap in another's input
    bad = tmp_path / "bad.json"
    src = (HISTORIES_DIR / "trajectory-completed.json").read_text()
    bad.write_text(src.replace('"activityType":{"name":"env.reset"}', '"activityType":{"name":"llm.generate"}', 1))
    proc = subprocess.run(
        [trajflow, "replay", "--check", str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED" in proc.stdout and "0/1 histories" in proc.stdout
