"""`trajflow bench reward-model --quick`: the local reward-model server (tiny model) at batch 1 and batched, its
requests from the shipped dataset, the batches the server formed and the same rewards either way."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import free_port
from trajflow.lab.bench.reward_model import main, requests


def test_requests_alternate_right_and_wrong_answers_from_the_dataset() -> None:
    bodies = requests(4)
    assert [b["response"] == f"\\boxed{{{b['reference']}}}" for b in bodies] == [True, False, True, False]
    assert all("Put the final answer in" in b["prompt"] for b in bodies)


def test_the_quick_bench_batches_and_keeps_every_reward(tmp_path: Path) -> None:
    out = tmp_path / "rm.json"
    assert main(True, out, 6, 8, free_port()) == 0
    report = json.loads(out.read_text())
    assert report["batch_1"]["batch_sizes"] == {"1": 6}  # the warm-up is not counted
    assert sum(int(k) * v for k, v in report["batched"]["batch_sizes"].items()) == 6
    assert max(int(k) for k in report["batched"]["batch_sizes"]) > 1
    assert report["same_rewards"] and report["max_reward_gap"] <= 1e-3
    assert report["machine"]["cores"] and report["speedup"] > 0
