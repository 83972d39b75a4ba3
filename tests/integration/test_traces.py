"""One trace per trajectory: a real rollout on the embedded stack (`trajflow up`, tiny config), its spans read back
from the workers' span files through `trajflow trace WORKFLOW_ID --json`, and the text timeline."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.conftest import wait_for
from trajflow.contracts.traces import attr

pytestmark = pytest.mark.integration


def test_a_rollout_is_one_trace_with_a_span_per_activity(cli_stack) -> None:
    proc = cli_stack.trajflow(
        "rollout", "-c", str(cli_stack.config), "--env", "game:GuessTheNumber-v0-easy", "--seed", "11", "--json"
    )
    result = json.loads(proc.stdout)
    wid, turns = result["workflow_id"], result["turns"]
    assert result["status"] == "completed" and turns >= 1

    def trace() -> dict | None:
        out = cli_stack.trajflow("trace", wid, "--json", check=False)
        if out.returncode != 0:
            return None
        data = json.loads(out.stdout)
        names = Counter(s["name"] for s in data["spans"])
        # the workers export in batches every half second: wait for the root and every activity's run
        return data if data["finished"] and names["run trajectory.save"] == 1 else None

    data = wait_for(trace, 30, interval_s=0.5, what="the trajectory's spans in the span files")
    spans = data["spans"]
    assert len({s["trace_id"] for s in spans}) == 1, "one trace per trajectory"
    names = Counter(s["name"] for s in spans)
    assert names["trajectory"] == 1
    for name in ("env.reset", "env.close", "reward.score", "trajectory.save"):
        assert names[name] == 1 and names[f"run {name}"] == 1, (name, names)
    assert names["llm.generate"] == names["env.step"] == turns, names
    assert names["run llm.generate"] == names["run env.step"] == turns, names

    by_id = {s["span_id"]: s for s in spans}
    root = next(s for s in spans if s["name"] == "trajectory")
    assert root["parent_id"] is None and root["depth"] == 0
    a = root["attributes"]
    assert a[attr("workflow_id")] == wid and a[attr("seed")] == 11
    assert a[attr("task")] == "guess-the-number" and a[attr("env")] == "game:GuessTheNumber-v0-easy"
    assert a[attr("status")] == "completed" and a[attr("turns")] == turns
    assert a[attr("reward")] == pytest.approx(result["reward"])
    assert root["service"] == "trajflow-orchestrator"

    # every activity call is a child of the root, and its run on a worker a child of the call, no longer than it
    generates = sorted((s for s in spans if s["name"] == "llm.generate"), key=lambda s: s["start_ns"])
    assert [s["attributes"][attr("turn")] for s in generates] == list(range(turns))
    for s in generates:
        assert s["attributes"][attr("policy_version")] == 0 and s["attributes"][attr("completion_tokens")] >= 1
    services = {"llm.generate": "decode", "env.step": "env", "env.reset": "env", "reward.score": "reward"}
    for s in spans:
        if s["name"].startswith("run "):
            call = by_id[s["parent_id"]]
            assert call["name"] == s["name"].removeprefix("run ") and call["parent_id"] == root["span_id"]
            assert call["start_ns"] <= s["start_ns"] and s["end_ns"] <= call["end_ns"]
            assert s["attributes"][attr("attempt")] == 1 and s["attributes"][attr("workflow_id")] == wid
            role = services.get(call["name"])
            if role is not None:
                assert s["service"] == f"trajflow-{role}"

    # the split of the time adds up to the episode's wall time
    assert data["total_s"] == pytest.approx(root["seconds"])
    assert sum(data["activity_s"].values()) + data["orchestration_s"] == pytest.approx(data["total_s"], abs=1e-3)
    assert data["total_s"] <= result["seconds"] + 1.0

    text = cli_stack.trajflow("trace", wid).stdout
    assert f"trajectory {wid}" in text and "where the time went" in text and "orchestration" in text
    assert text.count("llm.generate (turn") == turns


def test_an_unknown_trajectory_is_a_clear_error(cli_stack) -> None:
    proc = cli_stack.trajflow("trace", "no-such-trajectory", check=False)
    assert proc.returncode == 1
    assert "no spans of no-such-trajectory" in proc.stderr
