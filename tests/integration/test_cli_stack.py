"""The embedded stack as a user drives it: `trajflow up`, `status`, `rollout`, `down`, and a restart that keeps
every workflow (file-backed SQLite in WAL mode). Uses the tiny config so it stays fast."""

from __future__ import annotations

import json

import pytest

from tests.conftest import wait_for
from trajflow.infra.processes import ProcessTable, is_alive

pytestmark = pytest.mark.integration


def test_status_shows_every_process_and_a_poller_per_queue(cli_stack) -> None:
    out = cli_stack.trajflow("status", "-c", str(cli_stack.config)).stdout
    for name in ("temporal", "reward-service", "orchestrator", "decode", "env", "reward"):
        assert f"{name} " in out
    assert "DOWN" not in out
    for queue in ("trajflow ", "trajflow-decode-default", "trajflow-env-default", "trajflow-reward-default"):
        line = next(line for line in out.splitlines() if line.startswith(f"queue {queue}"))
        assert int(line.split()[-1]) >= 1, line


def test_rollout_json_and_transcript(cli_stack) -> None:
    proc = cli_stack.trajflow(
        "rollout",
        "-c",
        str(cli_stack.config),
        "--env",
        "game:GuessTheNumber-v0-easy",
        "--seed",
        "3",
        "--json",
        check=False,
    )
    result = json.loads(proc.stdout)
    assert {"workflow_id", "status", "turns", "reward", "trajectory_uri"} <= result.keys()
    assert result["status"] == "completed" and proc.returncode == 0
    assert result["turns"] >= 1 and result["reward"] is not None
    assert result["trajectory_uri"].startswith("file://" + str(cli_stack.state_dir))

    # the custom search attributes are registered and kept current: the same filter works in the UI's list
    import subprocess

    from trajflow.infra.temporal import temporal_binary

    query = f"WorkflowId = '{result['workflow_id']}' AND TrajflowStatus = 'completed' AND TrajflowTurns >= 1"

    def listed() -> bool:  # visibility is eventually consistent: poll, bounded
        proc = subprocess.run(
            [
                temporal_binary(),
                "workflow",
                "list",
                "--address",
                cli_stack.env["TRAJFLOW_TEMPORAL_ADDRESS"],
                "-q",
                query,
                "-o",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        return result["workflow_id"] in proc.stdout

    wait_for(listed, 30, interval_s=0.5, what="the workflow in a search-attribute query")

    text = cli_stack.trajflow("rollout", "-c", str(cli_stack.config), "--seed", "5").stdout
    assert "Guess The Number" in text and "status   completed" in text and "[action]" in text


def test_bad_config_is_a_clear_error(cli_stack, tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[tasks]]\nname = "x"\npools = { decode = "gpu-a" }\n')
    proc = cli_stack.trajflow("rollout", "-c", str(bad), check=False)
    assert proc.returncode == 2
    assert "gpu-a" in proc.stderr and "declares only" in proc.stderr


def test_restart_keeps_workflows_and_down_stops_exactly_what_up_started(cli_stack) -> None:
    first = json.loads(cli_stack.trajflow("rollout", "-c", str(cli_stack.config), "--seed", "11", "--json").stdout)
    records = ProcessTable(cli_stack.state_dir / "run").load()
    names = ["temporal", "reward-service", "orchestrator", "decode", "env", "reward", "trainer", "prometheus"]
    assert [r.name for r in records] == names and all(is_alive(r) for r in records)

    down = cli_stack.trajflow("down")
    assert "stopped 8" in down.stdout
    said = down.stdout + down.stderr
    assert said.index("prometheus: stopped") < said.index("temporal: stopped"), "Prometheus first, the server last"
    assert not any(is_alive(r) for r in records)

    cli_stack.trajflow("up", "-c", str(cli_stack.config))
    address = cli_stack.env["TRAJFLOW_TEMPORAL_ADDRESS"]
    import subprocess

    from trajflow.infra.temporal import temporal_binary

    described = subprocess.run(
        [temporal_binary(), "workflow", "describe", "--address", address, "-w", first["workflow_id"], "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert described.returncode == 0, described.stderr
    assert "COMPLETED" in described.stdout
    # and the restarted stack runs new trajectories
    again = json.loads(cli_stack.trajflow("rollout", "-c", str(cli_stack.config), "--seed", "12", "--json").stdout)
    assert again["status"] == "completed"
