"""A run that mixes three kinds of task (examples/multi-task/multi-task.toml: a GEM game, a shell task and a dataset
task, weighted 2:1:1, each on its own decode, env and reward pools) as a user runs it: `trajflow up -c` with that
config, `trajflow train`, `trajflow status RUN --json`. Tiny model, real trainer, Docker sandboxes, the reward service.

Checks that every task is trained on in the shares the workflow's weighted choice gives, that each task's
trajectories ran on its own pools (the records' decode pool per turn; the env and reward queues from each
trajectory's history), and that the per-task figures of the summary, the progress query and the step records add
up to the run's totals. Not checked: learning (the policy is random)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from tests.conftest import ROOT, started_cli_stack
from trajflow.contracts import names
from trajflow.contracts.config import load_run_config
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.runs import RunSummary
from trajflow.contracts.training import TrainingState
from trajflow.contracts.trajectory import TrajectoryStatus
from trajflow.workflows.bookkeeping import Book

pytestmark = pytest.mark.integration

CONFIG = ROOT / "examples" / "multi-task" / "multi-task.toml"
RUN = "multi-task-run"


@pytest.fixture(scope="module")
def multi_task_stack(cache_dir):
    with started_cli_stack(cache_dir, CONFIG, prefix="tf-multi-") as stack:
        yield stack


def expected_groups(groups: int) -> Counter[str]:
    """Task name -> groups among the first `groups` the workflow starts (its weighted choice, deterministic)."""
    run = load_run_config(CONFIG).training_run()
    book = Book(run, TrainingState(run_id=RUN))
    return Counter(run.tasks[book.pick_task(k)].name for k in range(groups))


async def scheduled_queues(client, workflow_id: str) -> dict[str, set[str]]:
    """Activity name -> the task queues it was scheduled on, from the workflow's history."""
    out: dict[str, set[str]] = {}
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            out.setdefault(attrs.activity_type.name, set()).add(attrs.task_queue.name)
    return out


def test_three_tasks_train_in_their_weighted_shares_each_on_its_own_pools(multi_task_stack, tmp_path) -> None:
    stack = multi_task_stack
    config = load_run_config(CONFIG)
    tasks = {t.name: t for t in config.tasks}
    # `up` started a poller on every declared pool's queue; `status` lists the queues of the config `up` started with
    listed = stack.trajflow("status").stdout
    assert f"queues of {CONFIG.resolve()}" in listed, listed
    for pool in ("game", "shell", "data"):
        for queue in (names.decode_queue(pool), names.env_queue(pool), names.reward_queue(pool)):
            assert f"queue {queue:40} pollers 1" in listed or f"queue {queue:40} pollers 2" in listed, listed

    out = tmp_path / "summary.json"
    proc = stack.trajflow("train", str(CONFIG), "--run-id", RUN, "--json-summary", str(out), timeout=900)
    summary = RunSummary.model_validate_json(out.read_text())
    run = config.training_run()
    per_group = expected_groups(run.steps * run.batch_size // run.group_size)
    assert per_group == {"guess": 4, "roman": 2, "chain-sum": 2}  # 2:1:1, two steps of four groups
    assert summary.steps == 2 and summary.trajectories_trained == 16 and summary.counters.groups_abandoned == 0
    trained = {name: t.trajectories_trained for name, t in summary.tasks.items()}
    assert trained == {name: n * run.group_size for name, n in per_group.items()}
    assert sum(trained.values()) == summary.trajectories_trained
    for i, mean in enumerate(summary.reward_by_step):  # sync: every batch is 2:1:1 too, and the means add up
        parts = [(t.reward_by_step[i], trained[name] // 2) for name, t in summary.tasks.items()]
        assert all(r is not None for r, _ in parts), parts
        assert abs(sum(r * n for r, n in parts if r is not None) / 8 - mean) < 1e-3, (parts, mean)
    for name, t in summary.tasks.items():  # the eval's tasks take turns over its 6 held-out seeds
        for ev in (t.eval_before, t.eval_after):
            assert ev is not None and ev.episodes == 2, (name, ev)
    # the live view and the closing line name every task
    for name in tasks:
        assert f"  {name:9}  last step: reward " in proc.stderr, proc.stderr[-3000:]
    assert "per task: guess " in proc.stdout and ", roman " in proc.stdout and ", chain-sum " in proc.stdout
    assert (stack.state_dir / "runs" / RUN / "reward.png").read_bytes()[:4] == b"\x89PNG"

    # the progress query (trajflow status RUN --json) has the same totals
    status = json.loads(stack.trajflow("status", RUN, "--json").stdout)
    progress = status["progress"]
    assert progress["tasks"] == list(tasks)
    assert {k: v["trajectories"] for k, v in progress["by_task"].items()} == trained
    assert {k: v["wins"] for k, v in progress["by_task"].items()} == {n: t.wins for n, t in summary.tasks.items()}
    assert sum(v["trajectories"] for v in progress["last"]["by_task"].values()) == progress["last"]["trajectories"]

    # each task's trajectories ran on its own pools: the records (decode pool per turn) and the histories
    store = stack.state_dir / "store" / "trajectories"
    records = [TrajectoryRecord.model_validate_json(p.read_text()) for p in store.glob(f"{RUN}-g*/*/trajectory.json")]
    completed = [r for r in records if r.status is TrajectoryStatus.COMPLETED]
    assert Counter(r.request.task for r in completed) == Counter(trained), Counter(r.request.task for r in records)
    for r in completed:
        pool = tasks[r.request.task].pools.decode
        assert r.request.pools == tasks[r.request.task].pools
        assert r.turns and {t.decode_pool for t in r.turns} == {pool}, (r.workflow_id, pool)
        assert r.request.env_id == tasks[r.request.task].env_id

    async def queues() -> dict[str, dict[str, set[str]]]:
        client = await stack.connect()
        return {r.workflow_id: await scheduled_queues(client, r.workflow_id) for r in completed}

    for wid, scheduled in asyncio.run(queues()).items():
        task = tasks[next(r.request.task for r in completed if r.workflow_id == wid)]
        p = task.pools
        assert scheduled[names.ENV_RESET] == {names.env_queue(p.env)}, (wid, scheduled)
        assert all(q.startswith(names.env_queue(p.env) + "-host-") for q in scheduled[names.ENV_STEP]), scheduled
        assert scheduled[names.LLM_GENERATE] == {names.decode_queue(p.decode)}, scheduled
        assert scheduled[names.REWARD_SCORE] == {names.reward_queue(p.reward)}, scheduled
