"""Honest refusals and budgets on the real Temporal dev server, Docker sandboxes and reward service: a training run
whose decode pool serves a frozen policy is refused at its start, with the reason, before it starts a trajectory;
an episode that reaches its context budget ends completed (truncated) and is scored by its reward rule, never
infra-failed."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from transformers import AutoTokenizer

from tests.conftest import running_stack
from tests.integration.test_trajectory import OUT_OF_RANGE, load_record
from trajflow.client import start_training
from trajflow.contracts import names
from trajflow.contracts.tasks import TaskConfig
from trajflow.contracts.training import TrainingRunConfig
from trajflow.contracts.trajectory import SamplingParams, StagePools, TrajectoryStatus
from trajflow.rl.engines.scripted import ScriptedEngine

pytestmark = pytest.mark.integration

GAME = "game:GuessTheNumber-v0-hard"
"""Out-of-range guesses go on to the turn limit: every turn's prompt is longer than the one before."""


@pytest.fixture()
def scripted(tiny_model):
    return ScriptedEngine(AutoTokenizer.from_pretrained(tiny_model), OUT_OF_RANGE)


async def test_a_training_run_on_a_frozen_engine_is_refused_at_its_start(
    temporal_env, reward_service, store, sandbox_manager, scripted
) -> None:
    assert not scripted.follows_training  # no weight source: it serves the initial model for ever
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, scripted) as st:
        task = TaskConfig(
            max_turns=1, sampling=SamplingParams(temperature=0.0, max_new_tokens=16),
            pools=StagePools(decode=st.pools, env=st.pools, reward=st.pools),
        )  # fmt: skip
        cfg = TrainingRunConfig(tasks=[task], trainer_pool=st.pools, steps=2, batch_size=2, group_size=2)
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        handle = await start_training(cfg, run_id=run_id, client=st.client, task_queue=st.queue)
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), 60)
        started = [wf async for wf in st.client.list_workflows(f"TrajflowRun = '{run_id}'")]
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == names.ERR_INVALID_INPUT and cause.non_retryable
    assert f"decode pool {st.pools!r} serves a frozen policy ('scripted'" in cause.message
    assert 'engine = "hf" or "vllm"' in cause.message
    assert started == [], "a refused run starts no trajectory"


async def test_an_episode_that_reaches_its_context_budget_ends_truncated_and_scored(
    temporal_env, reward_service, store, sandbox_manager, scripted
) -> None:
    reply_tokens = len(scripted.tokenizer.encode(OUT_OF_RANGE, add_special_tokens=False)) + 1  # and EOS
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, scripted) as stack:
        unbounded = await stack.run(stack.request(env_id=GAME, seed=3, env_kwargs={"max_turns": 6}, max_turns=6))
        full = load_record(store, unbounded.trajectory_uri).context
        assert unbounded.status is TrajectoryStatus.COMPLETED and unbounded.turns == 6 and full is not None
        # the budget is the 4th turn's prompt: turns 1-3 fit whole, the 4th has no room left
        budget = full.turn_spans[3][0]
        bounded = await stack.run(
            stack.request(env_id=GAME, seed=3, env_kwargs={"max_turns": 6}, max_turns=6, max_context_tokens=budget)
        )
        # a first prompt over the budget: nothing to score, the task's fault (failed), not the infrastructure's
        tiny = await stack.run(stack.request(env_id=GAME, seed=3, max_context_tokens=8))
    assert bounded.status is TrajectoryStatus.COMPLETED, bounded.error
    assert bounded.turns == 3 and bounded.reward is not None
    record = load_record(store, bounded.trajectory_uri)
    assert record.context_full and not load_record(store, unbounded.trajectory_uri).context_full
    assert record.context is not None and len(record.context.token_ids) <= budget
    assert [t.completion_tokens for t in record.turns] == [reply_tokens] * 3
    assert record.turns == load_record(store, unbounded.trajectory_uri).turns[:3], "the same episode, cut short"
    # scored by its reward rule (env_outcome: the sum of the env's rewards so far)
    assert bounded.reward == pytest.approx(sum(t.env_reward for t in record.turns))
    assert tiny.status is TrajectoryStatus.FAILED and tiny.reward is None
    assert tiny.error is not None and "leaves no room in the context budget (max_context_tokens = 8)" in tiny.error
