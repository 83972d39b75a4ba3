"""`trajflow trajectories list`, `replay` and `status RUN` as a user runs them, on the embedded stack (`trajflow
up` with the tiny config, in its own state dir); and a server that predates a search attribute gets it."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import wait_for
from trajflow.infra.temporal import temporal_binary

pytestmark = pytest.mark.integration

EASY = "game:GuessTheNumber-v0-easy"


def test_list_replay_and_status_through_the_cli(cli_stack) -> None:
    cfg = str(cli_stack.config)
    first = json.loads(
        cli_stack.trajflow("rollout", "-c", cfg, "--env", EASY, "--seed", "21", "--json", check=False).stdout
    )
    wid = first["workflow_id"]

    def listed():
        out = json.loads(
            cli_stack.trajflow(
                "trajectories",
                "list",
                "--status",
                first["status"],
                "--env",
                EASY,
                "--task",
                "guess-the-number",
                "--json",
            ).stdout  # fmt: skip
        )
        return out if wid in [t["workflow_id"] for t in out["trajectories"]] else None

    out = wait_for(listed, 30, interval_s=0.5, what="the rollout in `trajectories list`")
    row = next(t for t in out["trajectories"] if t["workflow_id"] == wid)
    assert (row["turns"], row["reward"], row["version"], row["env_failures"]) == (first["turns"], first["reward"], 0, 0)
    # the printed query is what the Web UI's search box takes: the server's own CLI answers it the same
    ui = subprocess.run(
        [
            temporal_binary(),
            "workflow",
            "list",
            "--address",
            cli_stack.env["TRAJFLOW_TEMPORAL_ADDRESS"],
            "-q",
            out["query"],
            "-o",
            "json",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ui.returncode == 0 and wid in ui.stdout, ui.stderr
    table = cli_stack.trajflow("trajectories", "list", "--env", EASY).stdout
    assert table.startswith(f"query: WorkflowType = 'TrajectoryWorkflow' AND TrajflowEnv = '{EASY}'") and wid in table

    replayed = json.loads(cli_stack.trajflow("replay", wid, "--json", check=False).stdout)
    assert replayed["replay"]["workflow_id"].startswith(f"{wid}-replay-")
    assert replayed["original"]["seed"] == replayed["replay"]["seed"] == 21
    assert replayed["original"]["first_observation"] == replayed["replay"]["first_observation"]

    env_only = cli_stack.trajflow("replay", wid, "--env-only").stdout
    assert env_only.count("(same as recorded)") == 1 + first["turns"], env_only
    assert "DIFFERS" not in env_only

    status = cli_stack.trajflow("status", wid).stdout
    assert (
        f"trajectory {wid}: {first['status']} (workflow completed)" in status
        and "TrajflowTask=guess-the-number" in status
    )
    assert "queue trajflow" in cli_stack.trajflow("status", "-c", cfg).stdout  # no RUN: the stack, as before
    missing = cli_stack.trajflow("status", "no-such-run", check=False)
    assert missing.returncode == 2 and "no workflow 'no-such-run'" in missing.stdout

    check = cli_stack.trajflow("replay", "--check", wid)
    assert f"workflow:{wid}" in check.stdout and "1/1 histories replay deterministically" in check.stdout


async def test_a_server_that_predates_a_search_attribute_gets_it() -> None:
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.testing import WorkflowEnvironment

    from trajflow.contracts import names
    from trajflow.infra.temporal import ensure_search_attributes

    old = [
        a
        for name, kind in names.SEARCH_ATTRIBUTES.items()
        if name != names.SA_TASK
        for a in ("--search-attribute", f"{name}={kind}")
    ]
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter, dev_server_existing_path=temporal_binary(), dev_server_extra_args=old
    )
    try:
        assert await ensure_search_attributes(env.client) == [names.SA_TASK]
        assert await ensure_search_attributes(env.client) == []
    finally:
        await env.shutdown()
