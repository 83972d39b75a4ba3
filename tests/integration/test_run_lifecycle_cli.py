"""A run's life on the command line, as a user lives it, on the stack `trajflow up` started (tiny model): the
`trajflow train` that started a run dies; `trajflow train --run-id` of the live run attaches instead of starting it
again; `trajflow stop` ends it after the current step and the attached view evaluates and writes the summary; a
run terminated with the `temporal` CLI has its trajectories ended by the orchestrator's sweep."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from temporalio.service import RPCError

from tests.conftest import ROOT, CliStack
from trajflow.contracts import names
from trajflow.contracts.training import TrainingProgress
from trajflow.infra.temporal import temporal_binary

pytestmark = pytest.mark.integration


def long_config(tmp_path: Path) -> Path:
    """The smoke config with more steps than the test lets it run, and a short evaluation, also during training."""
    text = (ROOT / "trajflow" / "configs" / "smoke.toml").read_text()
    text = text.replace("steps = 3", "steps = 40").replace(
        "eval = { episodes = 8 }", "eval = { episodes = 2, every = 1 }"
    )
    path = tmp_path / "long.toml"
    path.write_text(text)
    return path


def background(stack: CliStack, *args: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "trajflow"), *args], cwd=ROOT, env=stack.env, stdout=out, stderr=out
        )


def running_trajectories(stack: CliStack, run_id: str) -> int:
    async def count() -> int:
        client = await stack.connect()
        query = (
            f"WorkflowType = '{names.TRAJECTORY_WORKFLOW}' AND {names.SA_RUN} = '{run_id}' "
            "AND ExecutionStatus = 'Running'"
        )
        return (await client.count_workflows(query)).count

    return asyncio.run(count())


def wait_for(what: str, predicate, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)


def test_a_run_outlives_its_cli_is_re_attached_and_stopped(cli_stack: CliStack, tmp_path: Path) -> None:
    config, run_id = long_config(tmp_path), "life-run"
    run_dir = cli_stack.state_dir / "runs" / run_id
    first = background(cli_stack, "train", str(config), "--run-id", run_id, log=tmp_path / "first.log")
    try:
        wait_for(
            "the run to train a step",
            lambda: (run_dir / "eval_before.json").exists() and _version(cli_stack, run_id) >= 1,
        )
    finally:
        first.send_signal(signal.SIGKILL)  # the CLI dies; the run goes on
        first.wait()

    attached = background(
        cli_stack, "train", str(config), "--run-id", run_id, "--json-summary", str(tmp_path / "s.json"),
        log=tmp_path / "attached.log",
    )  # fmt: skip
    wait_for("the attached view", lambda: "step " in (tmp_path / "attached.log").read_text(), timeout_s=120)
    stopped = json.loads(cli_stack.trajflow("stop", run_id, "--reason", "test over", "--json").stdout)
    assert attached.wait(timeout=600) == 0, (tmp_path / "attached.log").read_text()

    log = (tmp_path / "attached.log").read_text()
    assert f"run {run_id} is already running: attaching to it" in log
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["stopped"] == stopped["stopped"] and summary["stopped"].startswith("test over at v")
    assert 1 <= summary["steps"] < 40 and summary["steps"] == stopped["version"]
    # the evaluation before (recorded by the first CLI) and after (run by the attached one)
    assert summary["eval_before"]["version"] == 0 and summary["eval_after"]["version"] == summary["steps"]
    assert json.loads((run_dir / "summary.json").read_text())["stopped"] == summary["stopped"]
    # the evals during training went on where the first CLI left them: each version at most once, and every one
    # missing said (pruned before either CLI held it); nothing is held any more
    curve = [p["version"] for p in summary["eval_curve"]]
    evaluated = [json.loads(line)["version"] for line in (run_dir / "eval_curve.jsonl").read_text().splitlines()]
    assert len(evaluated) == len(set(evaluated)) and curve == sorted({0, *evaluated, summary["steps"]})
    for v in set(range(1, summary["steps"])) - set(evaluated):
        assert f"held-out v{v}: not evaluated, its weights are not in the store" in log
    assert not list((cli_stack.state_dir / "store" / "runs" / run_id / "policy" / "holds").glob("v*"))
    assert running_trajectories(cli_stack, run_id) == 0
    # attaching to a run that ended gives its summary at once; an unknown run is a clear error
    again = cli_stack.trajflow("attach", run_id, "--no-eval")
    assert f"run {run_id}: {summary['steps']} steps" in again.stdout
    unknown = cli_stack.trajflow("attach", "no-such-run", check=False)
    assert unknown.returncode == 1 and "no training run 'no-such-run'" in unknown.stderr


def test_the_trajectories_of_a_run_terminated_from_the_temporal_cli_end(cli_stack: CliStack, tmp_path: Path) -> None:
    config, run_id = long_config(tmp_path), "terminated-run"
    cli = background(cli_stack, "train", str(config), "--run-id", run_id, "--no-eval", log=tmp_path / "train.log")
    try:
        wait_for("running trajectories", lambda: running_trajectories(cli_stack, run_id) > 0)
        subprocess.run(
            [temporal_binary(), "workflow", "terminate", "--workflow-id", run_id, "--reason", "test",
             "--address", cli_stack.env["TRAJFLOW_TEMPORAL_ADDRESS"]],
            check=True, capture_output=True,
        )  # fmt: skip
        # the orchestrator's sweep (every TRAJFLOW_RUN_SWEEP_S = 15 s) cancels them
        wait_for("the sweep to end them", lambda: running_trajectories(cli_stack, run_id) == 0, timeout_s=90)
        assert cli.wait(timeout=60) == 1  # the view says the run ended without a result
        assert "ended TERMINATED" in (tmp_path / "train.log").read_text()
    finally:
        cli.kill()


def _version(stack: CliStack, run_id: str) -> int:
    """The run's policy version from its progress query; 0 before it exists."""

    async def version() -> int:
        client = await stack.connect()
        try:
            handle = client.get_workflow_handle(run_id)
            return (await handle.query(names.QUERY_PROGRESS, result_type=TrainingProgress)).version
        except RPCError:
            return 0

    return asyncio.run(version())
