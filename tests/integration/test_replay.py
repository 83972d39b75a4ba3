"""`trajflow replay`, `trajectories list` and `status RUN` against the real stack: Temporal dev server, Docker
sandboxes running GEM, the reward service; a scripted policy so actions are known.

Covered: a re-run keeps the request (same seed, same first observation) and reports to nobody; `--from-failure`
continues an infra-failed trajectory once the infrastructure is back (container starts failing, then a sandbox
killed twice against a budget of one); `--env-only` shows the recorded observations again; the list's filters;
the live queries of a training run and of its trajectories.
"""

from __future__ import annotations

import asyncio
import re
import uuid

import pytest

from tests.conftest import async_wait_for, running_stack
from tests.integration.replay_helpers import GUESS, FlakyManager, SandboxKillingEngine
from trajflow.cli.commands import live
from trajflow.cli.commands.visibility import list_trajectories, trajectory_query
from trajflow.cli.replay.env_only import replay_env
from trajflow.cli.replay.formatting import side_by_side
from trajflow.cli.replay.rerun import continue_from_failure, rerun, started_request
from trajflow.client import start_training
from trajflow.contracts.tasks import TaskConfig
from trajflow.contracts.training import TrainingRunConfig
from trajflow.contracts.trajectory import SamplingParams, StagePools, TrajectoryStatus

pytestmark = pytest.mark.integration


@pytest.fixture()
def scripted(tiny_model):
    from transformers import AutoTokenizer

    from trajflow.rl.engines.scripted import ScriptedEngine

    return ScriptedEngine(AutoTokenizer.from_pretrained(tiny_model), GUESS)


def signals_sent(history) -> int:
    return sum(e.HasField("signal_external_workflow_execution_initiated_event_attributes") for e in history.events)


async def listed(client, query: str, expected: set[str]) -> list:
    """The rows of `query` once visibility shows exactly `expected` (it is eventually consistent)."""

    async def exactly():
        rows = await list_trajectories(client, query, 50)
        return (rows,) if {r.workflow_id for r in rows} == expected else None

    [rows] = await async_wait_for(exactly, timeout_s=30, interval_s=0.3, what=f"{expected} for {query}")
    return rows


async def test_rerun_keeps_the_request_and_reports_to_nobody(
    temporal_env, reward_service, store, sandbox_manager, scripted
):
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, scripted) as st:
        run = f"run-{st.tag}"
        req = st.request(task="guess", seed=5, max_turns=2, run_id=run)  # reports to its run (absent here)
        first = await st.run(req)
        old, new = await rerun(st.client, st.store, first.workflow_id, 120)
        replay_req, queue = await started_request(st.client, new.workflow_id)
        original_history = await st.client.get_workflow_handle(first.workflow_id).fetch_history()
        replay_history = await st.client.get_workflow_handle(new.workflow_id).fetch_history()
        replays = await listed(st.client, trajectory_query(replay_of=first.workflow_id), {new.workflow_id})
        of_run = await listed(st.client, trajectory_query(run=run), {first.workflow_id, new.workflow_id})
    assert new.workflow_id.startswith(f"{first.workflow_id}-replay-") and queue == st.queue
    assert replay_req == req.model_copy(update={"replay_of": first.workflow_id})
    assert old.seed == new.seed == 5
    assert new.result is not None and new.result.status is TrajectoryStatus.COMPLETED
    assert old.record and new.record and new.record.first_observation == old.record.first_observation
    assert [t.action for t in new.record.turns] == [t.action for t in old.record.turns]  # scripted policy
    assert signals_sent(original_history) == 1 and signals_sent(replay_history) == 0  # never counted by a run
    assert replays[0].replay_of == first.workflow_id and replays[0].task == "guess"
    assert {r.replay_of for r in of_run} == {None, first.workflow_id}  # the run's list marks its replays
    text = side_by_side(old, new)
    assert re.search(r"^first observation\s+= ", text, re.M) and re.search(r"^seed\s+= 5 ", text, re.M), text


async def test_each_list_filter_returns_exactly_its_trajectories(
    temporal_env, reward_service, store, sandbox_manager, scripted
):
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, scripted) as st:
        ta, tb, ra, rb = (f"{x}-{st.tag}" for x in ("ta", "tb", "ra", "rb"))
        a, b = await asyncio.gather(
            st.run(st.request(task=ta, run_id=ra, seed=1, max_turns=1)),
            st.run(st.request(task=tb, run_id=rb, seed=2, env_id="game:NoSuchGame-v0")),  # the env rejects it
        )
        assert (a.status, b.status) == (TrajectoryStatus.COMPLETED, TrajectoryStatus.FAILED)
        easy = "game:GuessTheNumber-v0-easy"
        cases = {
            trajectory_query(task=ta): {a.workflow_id},
            trajectory_query(run=rb): {b.workflow_id},
            trajectory_query(status="completed", run=ra): {a.workflow_id},
            trajectory_query(status="failed", run=rb): {b.workflow_id},
            trajectory_query(status="completed", run=rb): set(),
            trajectory_query(env=easy, task=ta): {a.workflow_id},
            trajectory_query(env="game:NoSuchGame-v0", task=tb): {b.workflow_id},
            trajectory_query(env=easy, task=tb): set(),
        }
        for query, expected in cases.items():
            rows = await listed(st.client, query, expected)
        [row] = await listed(st.client, trajectory_query(task=ta), {a.workflow_id})
    assert (row.status, row.run, row.turns, row.reward, row.env_failures) == ("completed", ra, 1, a.reward, 0)
    assert rows == []


async def test_from_failure_continues_once_sandboxes_start_again(
    temporal_env, reward_service, store, sandbox_manager, scripted
):
    flaky = FlakyManager(sandbox_manager)  # every container start fails: env.reset spends its retries
    async with running_stack(temporal_env, reward_service, store, flaky, scripted) as st:
        run = f"run-{st.tag}"
        result = await st.run(st.request(seed=6, max_turns=2, max_env_recoveries=0, run_id=run))
        assert result.status is TrajectoryStatus.INFRA_FAILED and flaky.failed_starts == 3, result
        [row] = await listed(st.client, trajectory_query(status="infra_failed", run=run), {result.workflow_id})
        assert (row.env_failures, row.turns, row.reward) == (1, 0, None)

        flaky.broken = False
        old, new, point = await continue_from_failure(st.client, st.store, result.workflow_id, 120)
        await listed(st.client, trajectory_query(status="completed", run=run), {result.workflow_id})
    assert "env.reset failed (SandboxStartError)" in point.failure
    assert new.workflow_id == old.workflow_id and new.run_id != old.run_id
    assert old.result is not None and old.result.status is TrajectoryStatus.INFRA_FAILED
    assert new.result is not None and new.result.status is TrajectoryStatus.COMPLETED, new.result
    assert new.result.turns == 2 and new.result.reward is not None
    assert old.record is not None and new.record is not None  # both runs' records are kept


async def test_from_failure_restores_a_killed_sandbox_and_finishes(
    temporal_env, reward_service, store, sandbox_manager, docker_client, scripted
):
    engine = SandboxKillingEngine(scripted, sandbox_manager, docker_client, kill_at={1, 2})
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as st:
        req = st.request(env_id="game:GuessTheNumber-v0-hard", seed=4, max_turns=4, max_env_recoveries=1)
        handle = await st.start(req)
        engine.handle = handle
        result = await handle.result()
        assert result.status is TrajectoryStatus.INFRA_FAILED and result.env_recoveries == 2, result
        engine.kill_at = set()  # the infrastructure is fine again
        old, new, point = await continue_from_failure(st.client, st.store, handle.id, 120)
    print(
        f"\nreset to event {point.event_id}, before: {point.failure}\n"
        + side_by_side(old, new, ("before the reset", "after the reset"))
    )
    assert "env.step failed (SandboxLost)" in point.failure
    assert new.result is not None and new.result.status is TrajectoryStatus.COMPLETED, new.result
    # from before the first failure: one recovery (the dead sandbox of then), the turns before it not redone
    assert new.result.env_recoveries == 1 and new.result.turns == 4
    assert engine.calls == 3 + 2  # turns 1-3 generated before the reset; turns 3 and 4 again after it
    assert new.record is not None
    for i, turn in enumerate(new.record.turns[:-1]):
        assert f"At turn {i + 1}, you guessed 999" in turn.observation


async def test_env_only_shows_the_recorded_observations_again(
    temporal_env, reward_service, store, sandbox_manager, scripted
):
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, scripted) as st:
        result = await st.run(st.request(seed=8, max_turns=3))
        lines: list[str] = []
        code = await replay_env(st.client, st.store, result.workflow_id, 120, False, lines.append)
        env_runs = await list_trajectories(
            st.client, f"WorkflowType = 'ReplayEnvWorkflow' AND TrajflowReplayOf = '{result.workflow_id}'", 5
        )
    text = "\n".join(lines)
    record = await asyncio.to_thread(store.get_json, result.trajectory_uri)
    assert code == 0, text
    assert record["first_observation"].strip() in text
    for turn in record["turns"]:
        assert turn["observation"].strip() in text and turn["action"].strip() in text
    assert text.count("(same as recorded)") == 1 + len(record["turns"]), text
    assert "DIFFERS" not in text and f"replayed {len(record['turns'])}/{len(record['turns'])} actions" in text
    assert len(env_runs) <= 1  # visibility may lag; the workflow itself ran (its output is above)


class HoldingEngine:
    """Holds every generation until released, so a test sees trajectories mid-episode."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.release = asyncio.Event()
        self.waiting = 0

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    async def generate(self, prompt_ids, params, policy=""):
        self.waiting += 1
        await self.release.wait()
        return await self.inner.generate(prompt_ids, params, policy)


async def test_status_shows_the_live_queries_of_a_run_and_its_trajectories(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, tmp_path
):
    from transformers import AutoTokenizer

    from trajflow.infra.policies import PolicyStore
    from trajflow.rl.engines.scripted import ScriptedEngine

    weights = PolicyStore(store, tmp_path / "policies", pointer_ttl_s=0.0)
    engine = HoldingEngine(ScriptedEngine(AutoTokenizer.from_pretrained(tiny_model), "\\boxed{5}", weights=weights))
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, train_step_s=0.1) as st:
        task = TaskConfig(
            name="guess", max_turns=2, sampling=SamplingParams(temperature=0.0, max_new_tokens=16),
            pools=StagePools(decode=st.pools, env=st.pools, reward=st.pools),
        )  # fmt: skip
        cfg = TrainingRunConfig(
            tasks=[task], trainer_pool=st.pools, steps=1, batch_size=2, group_size=2, alpha=0,
        )  # fmt: skip
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)

        async def both_mid_episode():
            s = await live.status(st.client, run_id, 50)
            ready = len(s["trajectories"]) == 2 and all((t["progress"] or {}).get("sandbox") for t in s["trajectories"])
            return s if ready and engine.waiting >= 2 else None

        s = await async_wait_for(both_mid_episode, timeout_s=60, interval_s=0.3, what="two trajectories mid-episode")
        child = await live.status(st.client, s["trajectories"][0]["workflow_id"], 50)
        text = live.format_status(s)
        engine.release.set()
        result = await asyncio.wait_for(handle.result(), 120)
    assert s["kind"] == "training" and s["attributes"]["TrajflowStatus"] == "training"
    p = s["progress"]
    assert (p["version"], p["steps"], p["running"], p["counters"]["started"]) == (0, 1, 2, 2)
    for t in s["trajectories"]:
        assert t["workflow_id"].startswith(f"{run_id}-g000000-")
        assert t["progress"]["turn"] == 0 and t["progress"]["env_recoveries"] == 0
        assert "Guess The Number" in t["progress"]["last_observation"]
    assert child["kind"] == "trajectory" and child["attributes"]["TrajflowRun"] == run_id
    assert child["attributes"]["TrajflowTask"] == "guess" and child["progress"]["max_turns"] == 2
    assert f"training {run_id}: training" in text and "version 0/1" in text and "turn 0/2" in text
    assert result.version == 1
