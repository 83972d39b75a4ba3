"""Agent programs that pass tools (issue 26): the model's chat template renders the tools, the completion's
`<tool_call>` block comes back to the program as an OpenAI tool call, its `tool` result extends the context and the
final text answer earns the reward; on a template without tools the trajectory fails saying so, and a task that
declares `tools = true` is refused at submission (the CLI, no stack).

The program is `tests/integration/agent_programs/tooluse.py` (stdlib only); the policy a scripted one on the tiny
model's tokenizer, with `trajflow.rl.models.TOOLS_TEMPLATE` (Hermes style) or its own ChatML (no tools)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tests.conftest import running_stack, submitted_offline
from trajflow.cli.replay.env_only import replay_env
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.trajectory import SamplingParams, TrajectoryStatus
from trajflow.rl.engines.scripted import ScriptedEngine
from trajflow.rl.models import TOOLS_TEMPLATE
from trajflow.sandbox.user.submit import package_env

pytestmark = pytest.mark.integration

PROGRAMS = Path(__file__).parent / "agent_programs"
ENV_ID = "agent:tooluse:solve"
CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>'


@pytest.fixture()
def package(store, cache_dir) -> str:
    return package_env(ENV_ID, str(PROGRAMS), store, cache_dir / "images", print)


def engine(tiny_model: Path, tools: bool) -> ScriptedEngine:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    if tools:
        tokenizer.chat_template = TOOLS_TEMPLATE
    return ScriptedEngine(tokenizer, [CALL, "hello"], name="tiny")


def request(st, package: str):
    sampling = SamplingParams(temperature=0.0, max_new_tokens=128)
    return st.request(env_id=ENV_ID, env_package=package, seed=1, sampling=sampling, task="tools", max_turns=4)


async def test_a_tool_call_round_trip_is_two_turns_and_earns_the_reward(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, package
) -> None:
    scripted = engine(tiny_model, tools=True)
    async with running_stack(
        temporal_env, reward_service, store, sandbox_manager, scripted, images=package_images
    ) as st:
        result = await st.run(request(st, package))
        lines: list[str] = []  # `trajflow replay --env-only`: the program re-run on its recorded answers, no LLM
        replayed = await replay_env(st.client, st.store, result.workflow_id, 120, False, lines.append)
    assert replayed == 0 and "replayed 2/2 actions; the episode ended" in "\n".join(lines), lines
    assert "DIFFERS" not in "\n".join(lines), "the replayed program got the same tool call and asked the same"
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert (result.turns, result.reward) == (2, 1.0)
    record = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri))
    answer = json.loads(record.turns[0].action)  # an answer with tool calls is recorded whole
    assert answer["finish_reason"] == "tool_calls" and answer["content"] is None
    assert answer["tool_calls"] == [
        {"id": "call_0_0", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}}
    ]
    second = json.loads(record.turns[0].observation)  # the program's next request: the call echoed, its result
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "tool"] and second["tools"]
    assert second["messages"][2] == {"role": "tool", "tool_call_id": "call_0_0", "content": "hello"}
    context = record.context
    assert context is not None and [m.role for m in context.messages] == ["user", "assistant", "tool", "assistant"]
    assert context.messages[1].tool_calls is not None and context.messages[1].content == ""
    # token-faithful: the raw sampled tool call is in the context, as sampled (mask 1)
    start, end = context.turn_spans[0]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    assert tokenizer.decode(context.token_ids[start:end], skip_special_tokens=True) == CALL
    assert sum(context.loss_mask) == sum(t.completion_tokens for t in record.turns)


async def test_tools_on_a_template_without_tools_fail_the_trajectory_saying_so(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, package
) -> None:
    scripted = engine(tiny_model, tools=False)
    async with running_stack(
        temporal_env, reward_service, store, sandbox_manager, scripted, images=package_images
    ) as st:
        result = await st.run(request(st, package))
    assert result.status is TrajectoryStatus.FAILED and result.reward is None, result
    assert "chat template (tiny) has no tools" in (result.error or ""), result.error
    assert "tools = true" in (result.error or "")


def test_a_task_that_passes_tools_is_refused_at_submission_on_a_model_without(tmp_path: Path) -> None:
    config = tmp_path / "tools.toml"
    config.write_text(
        f'[model]\nname_or_path = "tiny"\n\n[[tasks]]\nname = "reader"\nenv_id = "{ENV_ID}"\n'
        f'env_path = "{PROGRAMS}"\ntools = true\n'
    )
    for proc in submitted_offline(config, tmp_path / "state"):
        assert proc.returncode == 2, proc.stderr
        assert "task 'reader' passes tools (tools = true) but the model's chat template (tiny) has none" in proc.stderr
