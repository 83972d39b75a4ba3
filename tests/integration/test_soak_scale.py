"""`trajflow bench soak --scale --batch 256 --groups-per-shard 16` end to end (the CI size of the scale mode), on the
real Temporal dev server, reward service and store with the simulated engine, one-turn synthetic env and simulated
trainer: a sharded run (512 in flight at α = 1, in shards of 16 groups) of three steps of 256 trajectories that
continues as new at least twice, passes the loss audit, and reports each step's time taken apart and what the dev
server carried. At B = 512 (shards of 64, the run's default past 512 in flight) this test took 261 s of a 45-minute
pytest run on a 2-core AVX2 EPYC; B = 256 took 131 s there. Larger sizes and the default shard size: the bench's
(docs/capacity.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.own_stack]
TRAJFLOW = str(Path(sys.executable).parent / "trajflow")
B = 256
GROUPS_PER_SHARD = 16


def test_steps_of_256_in_shards_lose_nothing_and_say_where_the_time_goes(tmp_path: Path) -> None:
    out = tmp_path / "soak-scale.json"
    proc = subprocess.run(
        [TRAJFLOW, "bench", "soak", "--scale", "--batch", str(B), "--groups-per-shard", str(GROUPS_PER_SHARD)]
        + ["--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    s = json.loads(out.read_text())
    assert s["lost"] == [] and s["steps"] == 3 and s["continued_as_new"] >= 2, s["lost"]
    c = s["counters"]
    # groups that finished too late for alpha = 1 (timing) are dropped as stale and replaced: accounted, not lost
    assert c["consumed"] == 3 * B and c["started"] == c["completed"] == c["consumed"] + c["dropped_stale"], c
    assert c["failed"] == c["infra_failed"] == c["groups_abandoned"] == c["cancelled"] == 0, c
    assert s["trajectories_by_status"] == {"COMPLETED": c["started"]}
    # shards of 16 groups (a few smaller at the end), every one completed
    assert s["groups_per_shard"] == GROUPS_PER_SHARD and set(s["shards_by_status"]) == {"COMPLETED"}
    assert s["shards"] * GROUPS_PER_SHARD >= c["started"] // 8
    for step in s["per_step"]:
        assert step["trajectories"] == B
        assert step["wall_s"] > 0 and step["load_s"] > 0 and step["compute_s"] >= 1.0 and step["rest_s"] > 0, step
        assert step["wall_s"] == pytest.approx(step["load_s"] + step["compute_s"] + step["rest_s"], abs=0.05)
    # every group sent one report up, every shard one end (but those that ended after the run)
    assert s["signals_a_step"]["group_finished"] * 3 == pytest.approx(c["started"] / 8, abs=0.5), s["signals_a_step"]
    # (a step's average is rounded to a tenth: 17 ends over 3 steps read 5.7, and 5.7 x 3 = 17.1)
    assert 0 < s["signals_a_step"]["shard_finished"] * 3 <= s["shards"] + 3 * 0.05, (s["signals_a_step"], s["shards"])
    a = s["activities"]
    # one turn: reset, generate, step, close, score, save a trajectory; one manifest a group; the trainer's steps
    assert a["by_type"]["llm.generate"] == a["by_type"]["trajectory.save"] == c["started"]
    assert a["by_type"]["training.save_group"] == c["started"] // 8 and a["per_s"] > 0
    assert s["cpu_cores"]["server"] > 0 and s["cpu_cores"]["workers"] > 0
    assert all(0 < b < 512 * 1024 for b in s["continue_as_new_input_bytes"])
    assert "step 3/3" in proc.stderr and "nothing lost" in proc.stderr
