"""Record the workflow histories checked in under trajflow/cli/replay/histories/ from real runs (Temporal dev server,
Docker sandboxes, the reward service; a scripted policy so the runs are short and reproducible in shape).

Skipped unless TRAJFLOW_RECORD_HISTORIES=1: histories are refreshed deliberately, after a workflow change that is
*meant* to change command sequences (and is safe for running workflows, e.g. behind `workflow.patched`):

    TRAJFLOW_RECORD_HISTORIES=1 .venv/bin/python -m pytest -p no:cacheprovider
    tests/integration/test_record_histories.py

tests/unit/test_replay_histories.py replays every file there against the current code (and CI runs it), so a
change that breaks determinism for what these runs went through fails the unit tests.

Recorded: a completed trajectory; an infra-failed one (one sandbox restored by replay, then the budget spent);
the same trajectory continued by `replay --from-failure` (a reset run); an env-only replay; a TrainingWorkflow
run that continued as new (its first run, and the run that resumed and finished); a branch at turn 2 of a completed
trajectory (`trajflow branch`) that lost its sandbox once; a tree-rollouts training run.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType

from tests.conftest import running_stack
from tests.integration.replay_helpers import GUESS, SandboxKillingEngine
from trajflow.cli.replay.check import check, load_history
from trajflow.cli.replay.rerun import continue_from_failure
from trajflow.contracts.tasks import TaskConfig
from trajflow.contracts.training import TrainingRunConfig, TrainingStart
from trajflow.contracts.trajectory import SamplingParams, StagePools, TrajectoryStatus

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.environ.get("TRAJFLOW_RECORD_HISTORIES") != "1", reason="set TRAJFLOW_RECORD_HISTORIES=1"),
]

OUT = Path(__file__).resolve().parents[2] / "trajflow" / "cli" / "replay" / "histories"


def save(name: str, history) -> Path:
    """The history as `temporal workflow show -o json` writes it plus its `workflowId` (replay needs the real id),
    one event per line (small, readable diffs). Failures' stack traces are blanked: they name this machine's
    paths and play no part in replay."""
    OUT.mkdir(exist_ok=True)
    path = OUT / f"{name}.json"
    dicts = [_blank_stack_traces(e) for e in history.to_json_dict()["events"]]
    events = ",\n".join(json.dumps(e, separators=(",", ":")) for e in dicts)
    path.write_text(f'{{"workflowId": {json.dumps(history.workflow_id)}, "events": [\n{events}\n]}}\n')
    return path


def _blank_stack_traces(node):
    if isinstance(node, dict):
        return {k: "" if k == "stackTrace" else _blank_stack_traces(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_blank_stack_traces(v) for v in node]
    return node


@pytest.fixture()
def scripted(tiny_model):
    from transformers import AutoTokenizer

    from trajflow.rl.engines.scripted import ScriptedEngine

    return ScriptedEngine(AutoTokenizer.from_pretrained(tiny_model), GUESS)


async def test_record_trajectory_histories(
    temporal_env, reward_service, store, sandbox_manager, docker_client, scripted
):
    engine = SandboxKillingEngine(scripted, sandbox_manager, docker_client, kill_at=set())
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as st:
        completed = await st.start(
            st.request(task="guess", seed=1, max_turns=3), workflow_id=f"hist-completed-{st.tag}"
        )
        assert (await completed.result()).status is TrajectoryStatus.COMPLETED

        engine.calls, engine.kill_at = 0, {1, 2}
        req = st.request(task="guess", env_id="game:GuessTheNumber-v0-hard", seed=4, max_turns=4, max_env_recoveries=1)
        failed = await st.start(req, workflow_id=f"hist-infra-failed-{st.tag}")
        engine.handle = failed
        result = await failed.result()
        assert result.status is TrajectoryStatus.INFRA_FAILED and result.env_recoveries == 2, result

        # the sandbox is fine again: continue the infra-failed trajectory from before its first failure
        engine.kill_at = set()
        old, new, point = await continue_from_failure(st.client, st.store, failed.id, 120)
        assert new.result is not None and new.result.status is TrajectoryStatus.COMPLETED, new

        from trajflow.cli.replay.env_only import replay_env

        lines: list[str] = []
        assert await replay_env(st.client, st.store, completed.id, 120, False, lines.append) == 0
        env_replay = next(line.split()[2].rstrip(":") for line in lines if line.startswith("env-only replay"))

        histories = {
            "trajectory-completed": await completed.fetch_history(),
            "trajectory-infra-failed": await st.client.get_workflow_handle(
                failed.id, run_id=old.run_id
            ).fetch_history(),
            "trajectory-reset": await st.client.get_workflow_handle(failed.id, run_id=new.run_id).fetch_history(),
            "replay-env": await st.client.get_workflow_handle(env_replay).fetch_history(),
        }
    paths = [save(name, h) for name, h in histories.items()]
    assert all(r.error is None for r in await check([(str(p), load_history(p)) for p in paths]))


async def test_record_branch_history(temporal_env, reward_service, store, sandbox_manager, docker_client, scripted):
    from trajflow.client import start_branches

    engine = SandboxKillingEngine(scripted, sandbox_manager, docker_client, kill_at={4})  # the branch's 2nd turn
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as st:
        parent = await st.run(st.request(task="guess", seed=2, max_turns=3), workflow_id=f"hist-parent-{st.tag}")
        assert parent.status is TrajectoryStatus.COMPLETED, parent
        [branch] = await start_branches(parent.workflow_id, 2, 1, client=st.client, store=st.store)
        engine.handle = branch
        result = await branch.result()
        assert result.status is TrajectoryStatus.COMPLETED and result.env_recoveries == 1, result
        history = await branch.fetch_history()
    path = save("trajectory-branch", history)
    assert all(r.error is None for r in await check([(str(path), load_history(path))]))


async def test_record_training_history_that_continued_as_new(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, tmp_path
):
    from transformers import AutoTokenizer

    from trajflow.infra.policies import PolicyStore
    from trajflow.rl.engines.scripted import ScriptedEngine

    # stamps each turn with the run's newest published version (the simulated trainer publishes versions)
    weights = PolicyStore(store, tmp_path / "policies", pointer_ttl_s=0.0)
    engine = ScriptedEngine(AutoTokenizer.from_pretrained(tiny_model), "\\boxed{5}", weights=weights)
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, train_step_s=0.1) as st:
        task = TaskConfig(
            name="guess",
            max_turns=1,
            sampling=SamplingParams(temperature=0.0, max_new_tokens=16),
            pools=StagePools(decode=st.pools, env=st.pools, reward=st.pools),
        )
        cfg = TrainingRunConfig(
            tasks=[task], trainer_pool=st.pools, steps=3, batch_size=2, group_size=2, alpha=0,
            history_events_before_continue=50,
        )  # fmt: skip
        handle = await st.client.start_workflow(
            "TrainingWorkflow", TrainingStart(run=cfg), id=f"hist-training-{uuid.uuid4().hex[:6]}", task_queue=st.queue
        )
        await asyncio.wait_for(st.client.get_workflow_handle(handle.id).result(), 240)
        first = await st.client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id).fetch_history()
        last = await st.client.get_workflow_handle(handle.id).fetch_history()
    assert first.events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    assert last.events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED
    paths = [save("training-continued", first), save("training-resumed", last)]
    assert all(r.error is None for r in await check([(str(p), load_history(p)) for p in paths]))


async def test_record_tree_training_history(temporal_env, reward_service, store, sandbox_manager, tiny_model, tmp_path):
    """A tree-rollouts run (`rollout = { mode = "tree", roots = 2 }`, 2 steps of one group of 4): roots, then the
    branches their completions queued, started by the admission loop."""
    from transformers import AutoTokenizer

    from tests.integration.test_tree_rollouts import SeedGuessEngine
    from trajflow.contracts.rollouts import RolloutConfig
    from trajflow.infra.policies import PolicyStore

    weights = PolicyStore(store, tmp_path / "policies", pointer_ttl_s=0.0)
    engine = SeedGuessEngine(AutoTokenizer.from_pretrained(tiny_model), "unused", weights=weights)
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, train_step_s=0.1) as st:
        task = TaskConfig(
            name="guess",
            max_turns=3,
            sampling=SamplingParams(temperature=1.0, max_new_tokens=16),
            pools=StagePools(decode=st.pools, env=st.pools, reward=st.pools),
        )
        cfg = TrainingRunConfig(
            tasks=[task], trainer_pool=st.pools, steps=2, batch_size=4, group_size=4, alpha=0,
            rollout=RolloutConfig(mode="tree", roots=2),
        )  # fmt: skip
        handle = await st.client.start_workflow(
            "TrainingWorkflow", TrainingStart(run=cfg), id=f"hist-tree-{uuid.uuid4().hex[:6]}", task_queue=st.queue
        )
        await asyncio.wait_for(st.client.get_workflow_handle(handle.id).result(), 240)
        history = await st.client.get_workflow_handle(handle.id).fetch_history()
    assert history.events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED
    path = save("training-tree", history)
    assert all(r.error is None for r in await check([(str(path), load_history(path))]))
