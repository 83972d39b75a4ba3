"""Agent programs (`agent:MODULE:FUNCTION`) through the whole stack: packed like a user env, run in the hardened
sandbox against its OpenAI-compatible endpoint, every chat request a turn of the TrajectoryWorkflow on the decode
pool (a scripted policy on the real tokenizer), the program's return value the reward via the real reward service.
A killed sandbox is restored by re-running the program with its recorded answers; a program that crashes, hangs,
sends a malformed request, never asks, or asks other than its record on a restore ends `infra_failed` saying which;
`trajflow replay --env-only` re-runs a program on its recorded answers.

The programs are `tests/integration/agent_programs/faulty.py` (stdlib only); `ask_messages` and `ask_responses` speak
Anthropic's Messages and OpenAI's Responses API."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tests.conftest import running_stack
from tests.integration.test_trajectory import GatedEngine
from trajflow.cli.replay.env_only import replay_env
from trajflow.contracts import names
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.trajectory import SamplingParams, TrajectoryStatus
from trajflow.rl.engines.scripted import ScriptedEngine
from trajflow.sandbox.user.submit import package_env

pytestmark = pytest.mark.integration

PROGRAMS = Path(__file__).parent / "agent_programs"
SAMPLING = SamplingParams(temperature=0.0, max_new_tokens=16)


@pytest.fixture()
def package(store, cache_dir) -> str:
    return package_env("agent:faulty:ask", str(PROGRAMS), store, cache_dir / "images", print)


def script(tiny_model: Path, replies: list[str]) -> ScriptedEngine:
    return ScriptedEngine(AutoTokenizer.from_pretrained(tiny_model), replies)


def request(st, package: str, function: str, **kw):
    return st.request(
        env_id=f"agent:faulty:{function}", env_package=package, seed=5, task="agent",
        **{"max_turns": 4, "sampling": SAMPLING, **kw},
    )  # fmt: skip


async def test_every_chat_request_of_a_program_is_a_recorded_turn(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, package
) -> None:
    engine = script(tiny_model, ["maybe", "yes"])
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images) as st:
        result = await st.run(request(st, package, "ask", env_kwargs={"task": "is it?"}))
        lines: list[str] = []  # `trajflow replay --env-only`: the program re-run on its recorded answers, no LLM
        replayed = await replay_env(st.client, st.store, result.workflow_id, 120, False, lines.append)
    assert replayed == 0 and "replayed 2/2 actions; the episode ended" in "\n".join(lines), lines
    assert "DIFFERS" not in "\n".join(lines)
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert (result.turns, result.reward, result.env_recoveries) == (2, 1.0, 0)
    record = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri))
    first = json.loads(record.first_observation)
    assert first["messages"] == [{"role": "user", "content": "question 5: is it?"}] and first["call"] == 1
    second = json.loads(record.turns[0].observation)  # the program's next request extends its first
    assert [m["content"] for m in second["messages"]] == ["question 5: is it?", "maybe", "sure?"]
    assert record.turns[1].observation == "" and record.turns[1].env_reward == 1.0
    assert [t.action for t in record.turns] == ["maybe", "yes"]
    # token-faithful: the context holds both answers as sampled tokens (mask 1), the requests' messages once
    context = record.context
    assert context is not None
    assert [m.role for m in context.messages] == ["user", "assistant", "user", "assistant"]
    assert sum(context.loss_mask) == sum(t.completion_tokens for t in record.turns)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    answers = [tokenizer.decode(context.token_ids[a:b], skip_special_tokens=True) for a, b in context.turn_spans]
    assert answers == ["maybe", "yes"]


@pytest.mark.parametrize(
    ("function", "api"), [("ask_messages", "anthropic.messages"), ("ask_responses", "openai.responses")]
)
async def test_the_other_dialects_requests_are_recorded_turns_too(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, package, function: str, api: str
) -> None:
    """The same two-call dialogue over Anthropic's Messages API and OpenAI's Responses API: each request is a turn, the
    second extends the first (the answer sent back in the dialect's shape is the assistant turn as recorded), and the
    context holds both answers as sampled tokens."""
    engine = script(tiny_model, ["maybe", "yes"])
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images) as st:
        result = await st.run(request(st, package, function, env_kwargs={"task": "is it?"}))
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert (result.turns, result.reward) == (2, 1.0)
    record = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri))
    first, second = json.loads(record.first_observation), json.loads(record.turns[0].observation)
    assert first["api"] == second["api"] == api
    assert [m["content"] for m in second["messages"]] == ["Answer.", "question 5: is it?", "maybe", "sure?"]
    context = record.context
    assert context is not None and [m.role for m in context.messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert sum(context.loss_mask) == sum(t.completion_tokens for t in record.turns)


async def test_a_request_with_a_stop_sequence_gets_the_answer_before_it(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, package
) -> None:
    engine = script(tiny_model, ["Action: ls\nObservation: made up by the model"])
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images) as st:
        result = await st.run(request(st, package, "react", sampling=SamplingParams(max_new_tokens=64)))
    assert result.status is TrajectoryStatus.COMPLETED and result.reward == 1.0, result
    record = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri))
    assert record.turns[0].action == "Action: ls\n"  # what the model said after it is not kept


async def run_killing_its_sandbox(st, req, engine: GatedEngine, sandbox_manager, docker_client):
    """Run `req`, killing its sandbox's container while `engine` holds its gated call; the trajectory's result."""
    handle = await st.start(req)
    await asyncio.wait_for(engine.reached.wait(), 180)
    progress = await handle.query(names.QUERY_PROGRESS)
    docker_client.containers.get(sandbox_manager.get(progress["sandbox"]).container_id).kill()
    engine.released.set()
    return await handle.result()


async def test_a_killed_sandbox_reruns_the_program_with_its_recorded_answers(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, package, docker_client
) -> None:
    engine = GatedEngine(script(tiny_model, ["maybe", "yes"]), gate_at=1)
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images) as st:
        result = await run_killing_its_sandbox(st, request(st, package, "ask"), engine, sandbox_manager, docker_client)
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert (result.turns, result.reward, result.env_recoveries) == (2, 1.0, 1)
    assert engine.calls == 2, "the restored program's first call was answered from the record, not decoded"


@pytest.mark.parametrize(
    ("function", "env_kwargs", "says"),
    [
        ("crash", {}, "crashed"),
        ("hang", {"budget_s": 3}, "hung"),
        ("malformed", {}, "malformed_request"),
        ("silent", {}, "ended without a chat request"),
    ],
)
async def test_a_failing_program_ends_infra_failed_saying_which(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, package, function, env_kwargs,
    says,
) -> None:  # fmt: skip
    engine = script(tiny_model, ["fine"])
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images) as st:
        result = await st.run(request(st, package, function, env_kwargs=env_kwargs))
    assert result.status is TrajectoryStatus.INFRA_FAILED and result.reward is None, result
    assert says in (result.error or ""), result.error
    assert result.env_recoveries == 0, "a program's own failure is not retried in a fresh sandbox"
    if function == "crash":
        assert "the agent broke here" in (result.error or "")


async def test_a_program_that_asks_other_than_its_record_cannot_be_restored(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, package, docker_client
) -> None:
    engine = GatedEngine(script(tiny_model, ["one", "two"]), gate_at=1)
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images) as st:
        req = request(st, package, "restless")
        result = await run_killing_its_sandbox(st, req, engine, sandbox_manager, docker_client)
    assert result.status is TrajectoryStatus.INFRA_FAILED, result
    assert names.ERR_AGENT_NONDETERMINISTIC in (result.error or ""), result.error
