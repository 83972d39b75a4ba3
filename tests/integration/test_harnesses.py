"""Real agent harnesses, unmodified, through the whole stack: the harness's own package installed into the task's
sandbox layer from its requirements (offline wheels), the program run in the hardened sandbox against the env's
endpoint, every model call a turn of the TrajectoryWorkflow on the decode pool, the program's result the reward via
the real reward service. The policy is scripted (tool call, tool call, final answer) on the tiny model's tokenizer
with `trajflow.rl.models.TOOLS_TEMPLATE`, so several calls with tool calls run on a CPU; each call must be a recorded
turn with its sampled token ids, and `trajflow replay --env-only` must re-run the harness on its recorded answers.

- the Codex CLI (`examples/harnesses/codex`, npm `@openai/codex` run by Debian's Node, `codex exec`, Responses API
  streamed) fixing a bug, its reward from a verifier that runs the repository's checks;
- Claude Code (`examples/harnesses/claude-code`, npm `@anthropic-ai/claude-code` run by Debian's Node, `claude -p
  --bare`, Anthropic's Messages API streamed) fixing a bug, its reward from a verifier;
- mini-swe-agent (`examples/harnesses/mini-swe-agent`, `mini` with its default config, Chat Completions with a
  `bash` tool) fixing a bug in a small repository, its reward from a verifier that runs the repository's tests;
- the OpenAI Agents SDK (`examples/harnesses/agents-sdk`, `openai-agents`, Responses API), non-streaming and streamed;
  and its example config as a researcher runs it, on the stack `trajflow up` started (the tiny model, whose config
  renders with `chat_template = "hermes-tools"`): `trajflow rollout`, then a 2-step `trajflow train`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tests.conftest import ROOT, running_stack
from trajflow.cli.replay.env_only import replay_env
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.trajectory import SamplingParams, TrajectoryStatus
from trajflow.infra.store import LocalStore
from trajflow.rl.engines.scripted import ScriptedEngine
from trajflow.rl.models import TOOLS_TEMPLATE
from trajflow.sandbox.user.submit import package_env

pytestmark = [pytest.mark.integration, pytest.mark.harness]

AGENTS_SDK = ROOT / "examples" / "harnesses" / "agents-sdk"
SDK_ENV = "agent:calc_agent:solve"
SDK_SCRIPT = [  # seed 3 asks "What is (5 + 3) * 2?"
    '<tool_call>\n{"name": "add", "arguments": {"a": 5, "b": 3}}\n</tool_call>',
    '<tool_call>\n{"name": "multiply", "arguments": {"a": 8, "b": 2}}\n</tool_call>',
    "The answer is 16.",
]
CODEX = ROOT / "examples" / "harnesses" / "codex"


def exec_command(cmd: str) -> str:
    return f'<tool_call>\n{{"name": "exec_command", "arguments": {json.dumps({"cmd": cmd})}}}\n</tool_call>'


CODEX_SCRIPT = [
    exec_command("cat inventory.py"),
    exec_command("sed -i 's/) - count/) + count/' inventory.py"),
    "Fixed: restock() now adds the count.",
]


def codex_masked(request: str) -> str:
    """A Codex request without what differs between two runs on the same answers: its tool results' chunk ids and
    wall times."""
    request = re.sub(r"Chunk ID: [0-9a-f]+", "Chunk ID: _", request)
    return re.sub(r"Wall time: [0-9.]+ seconds", "Wall time: _", request)


CLAUDE_CODE = ROOT / "examples" / "harnesses" / "claude-code"


def claude_bash(command: str) -> str:
    arguments = json.dumps({"command": command, "description": "Run it"})
    return f'<tool_call>\n{{"name": "Bash", "arguments": {arguments}}}\n</tool_call>'


CLAUDE_SCRIPT = [
    claude_bash("cat words.py"),
    claude_bash("sed -i 's/split(\" \")/split()/' words.py"),
    "Fixed: count_words() now splits on any whitespace.",
]
MINI_SWE = ROOT / "examples" / "harnesses" / "mini-swe-agent"
MINI_ENV = "agent-cmd:run.sh"


def bash(command: str, said: str) -> str:
    return f'{said}\n<tool_call>\n{{"name": "bash", "arguments": {json.dumps({"command": command})}}}\n</tool_call>'


MINI_SCRIPT = [
    bash("cat calc.py", "Let me read the code."),
    bash("sed -i 's/(len(values) + 1)/len(values)/' calc.py", "The divisor is off by one."),
    bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "Fixed."),
]


def scripted(tiny_model: Path, replies: list[str]) -> ScriptedEngine:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = TOOLS_TEMPLATE
    return ScriptedEngine(tokenizer, replies, name="tiny")


@pytest.fixture()
def sdk_package(store, cache_dir) -> str:
    return package_env(SDK_ENV, str(AGENTS_SDK), store, cache_dir / "images", print)


@pytest.fixture()
def codex_package(store, cache_dir) -> str:
    return package_env(MINI_ENV, str(CODEX), store, cache_dir / "images", print)


async def test_the_codex_cli_fixes_a_bug_and_its_verifier_scores_the_checks(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, codex_package
) -> None:
    engine = scripted(tiny_model, CODEX_SCRIPT)
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images) as st:
        request = st.request(
            env_id=MINI_ENV, env_package=codex_package, seed=1, task="codex", max_turns=8,
            env_kwargs={"verifier": "verify:checks_pass", "budget_s": 120},
            sampling=SamplingParams(temperature=0.0, max_new_tokens=128),
        )  # fmt: skip
        result = await st.run(request)
        lines: list[str] = []
        replayed = await replay_env(st.client, st.store, result.workflow_id, 180, False, lines.append)
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert (result.turns, result.reward) == (3, 1.0), result
    assert replayed == 0 and "replayed 3/3 actions; the episode ended" in "\n".join(lines), lines
    record = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri))
    # the re-run asks the same first request (its cwd, in it, is the same path in every run); Codex's later requests
    # carry its tool results, each with a random chunk id and a wall time: equal once those are masked
    flat = "\n".join(lines).split("\n")
    shown = [
        (line.removeprefix("[observation] "), flat[i + 1])
        for i, line in enumerate(flat)
        if line[:15] == "[observation] {"
    ]
    recorded = [record.first_observation, *(t.observation for t in record.turns[:-1])]
    assert [codex_masked(request) for request, _ in shown] == [codex_masked(r) for r in recorded]
    assert shown[0][1] == "(same as recorded)" and "DIFFERS" in shown[1][1], [verdict for _, verdict in shown]
    requests = [json.loads(record.first_observation), *(json.loads(t.observation) for t in record.turns[:-1])]
    assert [(r["api"], r["stream"]) for r in requests] == [("openai.responses", True)] * 3
    assert all("exec_command" in [t["function"]["name"] for t in r["tools"]] for r in requests)
    assert "restock() in inventory.py" in requests[0]["messages"][-1]["content"]
    # Codex ran each command in the repository and sent its output back as the call's result
    assert requests[1]["messages"][-1]["role"] == "tool" and ") - count" in requests[1]["messages"][-1]["content"]
    context = record.context
    assert context is not None and len(context.turn_spans) == 3
    assert sum(context.loss_mask) == sum(t.completion_tokens for t in record.turns)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    sampled = [tokenizer.decode(context.token_ids[a:b], skip_special_tokens=True) for a, b in context.turn_spans]
    assert sampled == CODEX_SCRIPT


async def test_a_codex_turn_cut_at_max_tokens_is_scored_not_a_crash(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, codex_package
) -> None:
    """Codex fails its turn on an answer cut at max tokens (an incomplete response) and exits 1: run.sh takes that for
    the policy's doing, so the episode is scored (0.0: the bug is still there), not an infrastructure failure."""
    engine = scripted(tiny_model, ["I will start by reading every file of the repository, one after another, " * 4])
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images) as st:
        request = st.request(
            env_id=MINI_ENV, env_package=codex_package, seed=1, task="codex", max_turns=8,
            env_kwargs={"verifier": "verify:checks_pass", "budget_s": 120},
            sampling=SamplingParams(temperature=0.0, max_new_tokens=32),
        )  # fmt: skip
        result = await st.run(request)
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert (result.turns, result.reward) == (1, 0.0), result


@pytest.fixture()
def claude_package(store, cache_dir) -> str:
    return package_env(MINI_ENV, str(CLAUDE_CODE), store, cache_dir / "images", print)


async def test_claude_code_fixes_a_bug_and_its_verifier_scores_the_checks(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, claude_package
) -> None:
    engine = scripted(tiny_model, CLAUDE_SCRIPT)
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images) as st:
        request = st.request(
            env_id=MINI_ENV, env_package=claude_package, seed=1, task="claude", max_turns=11,
            env_kwargs={"verifier": "verify:words_fixed", "budget_s": 120},
            sampling=SamplingParams(temperature=0.0, max_new_tokens=128),
        )  # fmt: skip
        result = await st.run(request)
        lines: list[str] = []  # `trajflow replay --env-only`: Claude Code re-run on its recorded answers, no LLM
        replayed = await replay_env(st.client, st.store, result.workflow_id, 180, False, lines.append)
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert (result.turns, result.reward) == (3, 1.0), result
    assert replayed == 0 and "replayed 3/3 actions; the episode ended" in "\n".join(lines), lines
    assert "DIFFERS" not in "\n".join(lines), "the re-run asked other than the record"
    record = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri))
    requests = [json.loads(record.first_observation), *(json.loads(t.observation) for t in record.turns[:-1])]
    assert [(r["api"], r["stream"]) for r in requests] == [("anthropic.messages", True)] * 3
    assert [sorted(t["function"]["name"] for t in r["tools"]) for r in requests] == [["Bash", "Edit", "Read"]] * 3
    assert [r["sampling"]["max_tokens"] for r in requests] == [32000] * 3  # what it asks; the task's sampling caps it
    assert "count_words() in words.py" in requests[0]["messages"][-1]["content"]
    # Claude Code ran each command in the repository and sent its output back as the tool's result
    assert requests[1]["messages"][-1]["role"] == "tool" and 'split(" ")' in requests[1]["messages"][-1]["content"]
    context = record.context
    assert context is not None and len(context.turn_spans) == 3
    assert sum(context.loss_mask) == sum(t.completion_tokens for t in record.turns)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    sampled = [tokenizer.decode(context.token_ids[a:b], skip_special_tokens=True) for a, b in context.turn_spans]
    assert sampled == CLAUDE_SCRIPT


@pytest.fixture()
def mini_package(store, cache_dir) -> str:
    return package_env(MINI_ENV, str(MINI_SWE), store, cache_dir / "images", print)


async def test_mini_swe_agent_fixes_a_bug_and_its_verifier_scores_the_tests(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, mini_package
) -> None:
    engine = scripted(tiny_model, MINI_SCRIPT)
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images) as st:
        request = st.request(
            env_id=MINI_ENV, env_package=mini_package, seed=1, task="mini", max_turns=8,
            env_kwargs={"verifier": "verify:tests_pass", "budget_s": 120},
            sampling=SamplingParams(temperature=0.0, max_new_tokens=128),
        )  # fmt: skip
        result = await st.run(request)
        lines: list[str] = []
        replayed = await replay_env(st.client, st.store, result.workflow_id, 180, False, lines.append)
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert (result.turns, result.reward) == (3, 1.0), result
    assert replayed == 0 and "replayed 3/3 actions; the episode ended" in "\n".join(lines), lines
    assert "DIFFERS" not in "\n".join(lines)
    record = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri))
    requests = [json.loads(record.first_observation), *(json.loads(t.observation) for t in record.turns[:-1])]
    assert ["api" in r for r in requests] == [False] * 3  # Chat Completions, through litellm
    assert [[t["function"]["name"] for t in r["tools"]] for r in requests] == [["bash"]] * 3
    assert "Fix calc.py" in requests[0]["messages"][1]["content"]
    # mini ran each command in the repository and sent its output back as the tool's result
    assert requests[1]["messages"][-1]["role"] == "tool" and "len(values) + 1" in requests[1]["messages"][-1]["content"]
    assert [m["role"] for m in requests[2]["messages"]] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    context = record.context
    assert context is not None and len(context.turn_spans) == 3
    assert sum(context.loss_mask) == sum(t.completion_tokens for t in record.turns)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    sampled = [tokenizer.decode(context.token_ids[a:b], skip_special_tokens=True) for a, b in context.turn_spans]
    assert sampled == MINI_SCRIPT


@pytest.mark.parametrize("stream", [False, True])
async def test_the_agents_sdk_with_two_function_tools(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, sdk_package, stream: bool
) -> None:
    engine = scripted(tiny_model, SDK_SCRIPT)
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images) as st:
        request = st.request(
            env_id=SDK_ENV, env_package=sdk_package, seed=3, task="sdk", max_turns=6,
            env_kwargs={"task": json.dumps({"stream": stream})},
            sampling=SamplingParams(temperature=0.0, max_new_tokens=128),
        )  # fmt: skip
        result = await st.run(request)
        lines: list[str] = []  # `trajflow replay --env-only`: the harness re-run on its recorded answers, no LLM
        replayed = await replay_env(st.client, st.store, result.workflow_id, 120, False, lines.append)
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert (result.turns, result.reward) == (3, 1.0), result
    assert replayed == 0 and "replayed 3/3 actions; the episode ended" in "\n".join(lines), lines
    assert "DIFFERS" not in "\n".join(lines)
    record = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri))
    requests = [json.loads(record.first_observation), *(json.loads(t.observation) for t in record.turns[:-1])]
    assert [r["api"] for r in requests] == ["openai.responses"] * 3 and [r["stream"] for r in requests] == [stream] * 3
    assert [[t["function"]["name"] for t in r["tools"]] for r in requests] == [["add", "multiply"]] * 3
    assert requests[0]["messages"][0]["role"] == "system" and "calculator" in requests[0]["messages"][0]["content"]
    assert requests[0]["messages"][1] == {"role": "user", "content": "What is (5 + 3) * 2?"}
    # the SDK ran each tool and sent its result back: the third request holds both calls and both results
    assert [(m["role"], m.get("content")) for m in requests[2]["messages"][2:]] == [
        ("assistant", None), ("tool", "8"), ("assistant", None), ("tool", "16"),
    ]  # fmt: skip
    assert record.turns[-1].observation == ""
    context = record.context  # every call a turn: its sampled tokens in the context, as sampled (mask 1)
    assert context is not None and len(context.turn_spans) == 3
    assert all(turn.completion_tokens > 0 for turn in record.turns)
    assert sum(context.loss_mask) == sum(t.completion_tokens for t in record.turns)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    sampled = [tokenizer.decode(context.token_ids[a:b], skip_special_tokens=True) for a, b in context.turn_spans]
    assert sampled == SDK_SCRIPT


def tiny_config(example: Path, tmp_path: Path, train: str) -> Path:
    """The example's config with the stack's tiny model (same template, task, program and reward) and `train`."""
    text = (example / "config.toml").read_text().split("\n[train]\n")[0]
    text = text.replace('name_or_path = "smollm2"', 'name_or_path = "tiny"').replace(
        'env_path = "."', f'env_path = "{example}"'
    )
    assert 'name_or_path = "tiny"' in text and str(example) in text
    path = tmp_path / f"{example.name}.toml"
    path.write_text(text + train)
    return path


def test_the_agents_sdk_example_rolls_out_and_trains_two_steps(cli_stack, tmp_path: Path) -> None:
    """The untrained tiny policy answers the SDK with text (no tool call), so each episode is one model call that the
    SDK takes as its final output: completed, scored 0.0 or 1.0 by the program, trained on."""
    train = (
        "\n[train]\nsteps = 2\nbatch_size = 8\ngroup_size = 4\nalpha = 1\n"
        "trainer = { lr = 1e-4, micro_batch = 8 }\neval = { episodes = 4 }\n"
    )
    config = tiny_config(AGENTS_SDK, tmp_path, train)
    proc = cli_stack.trajflow("rollout", "-c", str(config), "--seed", "3", "--json", timeout=900)
    out = json.loads(proc.stdout)
    assert out["status"] == "completed" and out["reward"] in (0.0, 1.0) and out["turns"] >= 1, out
    record = TrajectoryRecord.model_validate(LocalStore(cli_stack.state_dir).get_json(out["trajectory_uri"]))
    first = json.loads(record.first_observation)
    assert first["api"] == "openai.responses" and [t["function"]["name"] for t in first["tools"]] == ["add", "multiply"]
    assert record.context is not None and len(record.context.turn_spans) == out["turns"]
    summary_path = tmp_path / "summary.json"
    cli_stack.trajflow("train", str(config), "--run-id", "sdk-run", "--json-summary", str(summary_path), timeout=1200)
    summary = json.loads(summary_path.read_text())
    assert summary["steps"] == 2 and summary["trajectories_trained"] == 16, summary
    assert summary["eval_after"]["episodes"] == 4 and summary["eval_after"]["version"] == 2
