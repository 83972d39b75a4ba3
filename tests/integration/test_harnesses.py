"""Real agent harnesses, unmodified, through the whole stack: the harness's own package installed into the task's
sandbox layer (wheels from requirements.txt, npm packages with Debian's Node), the program run in the hardened sandbox
against the env's endpoint, every model call a turn of the TrajectoryWorkflow on the decode pool, the program's result
(or its verifier's) the reward via the real reward service. The policy is scripted (tool call, tool call, final
answer) on the tiny model's tokenizer with `trajflow.rl.models.TOOLS_TEMPLATE`, so several calls with tool calls run
on a CPU; each call must be a recorded turn with its sampled token ids, and `trajflow replay --env-only` must re-run
the harness on its recorded answers.

- the Codex CLI (`examples/harnesses/codex`, npm `@openai/codex` run by Debian's Node, `codex exec`, Responses API
  streamed) fixing a bug, its reward from a verifier that runs the repository's checks; a turn cut at max tokens;
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from tests.conftest import ROOT, running_stack
from trajflow.cli.replay.env_only import replay_env
from trajflow.client import start_branches
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.trajectory import SamplingParams, TrajectoryResult, TrajectoryStatus
from trajflow.infra.store import LocalStore
from trajflow.rl.engines.scripted import ScriptedEngine
from trajflow.rl.models import TOOLS_TEMPLATE
from trajflow.sandbox.user.submit import package_env

pytestmark = [pytest.mark.integration, pytest.mark.harness]

HARNESSES = ROOT / "examples" / "harnesses"
COMMAND_ENV = "agent-cmd:run.sh"
SDK_ENV = "agent:calc_agent:solve"


def tool_call(name: str, arguments: dict[str, Any], said: str = "") -> str:
    """A reply that calls `name`, as a Hermes-template model writes it."""
    block = f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'
    return f"{said}\n{block}" if said else block


SDK_SCRIPT = [  # seed 3 asks "What is (5 + 3) * 2?"
    tool_call("add", {"a": 5, "b": 3}),
    tool_call("multiply", {"a": 8, "b": 2}),
    "The answer is 16.",
]
CODEX_SCRIPT = [
    tool_call("exec_command", {"cmd": "cat inventory.py"}),
    tool_call("exec_command", {"cmd": "sed -i 's/) - count/) + count/' inventory.py"}),
    "Fixed: restock() now adds the count.",
]
CLAUDE_SCRIPT = [
    tool_call("Bash", {"command": "cat words.py", "description": "Run it"}),
    tool_call("Bash", {"command": "sed -i 's/split(\" \")/split()/' words.py", "description": "Run it"}),
    "Fixed: count_words() now splits on any whitespace.",
]
MINI_SCRIPT = [
    tool_call("bash", {"command": "cat calc.py"}, "Let me read the code."),
    tool_call("bash", {"command": "sed -i 's/(len(values) + 1)/len(values)/' calc.py"}, "The divisor is off by one."),
    tool_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}, "Fixed."),
]


def codex_masked(request: str) -> str:
    """A Codex request without what differs between two runs on the same answers: its tool results' chunk ids and
    wall times."""
    request = re.sub(r"Chunk ID: [0-9a-f]+", "Chunk ID: _", request)
    return re.sub(r"Wall time: [0-9.]+ seconds", "Wall time: _", request)


@dataclass
class Run:
    result: TrajectoryResult
    record: TrajectoryRecord
    requests: list[dict[str, Any]]
    """Each call's request, as the turn recorded it."""
    replay: list[str]
    """What `trajflow replay --env-only` said, line by line."""
    branch: TrajectoryRecord | None = None
    """A branch of the trajectory, when asked for."""


@pytest.fixture()
def harness(temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, cache_dir):
    """Runs one trajectory of the harness in `examples/harnesses/NAME` on a scripted policy, then re-runs it on its
    recorded answers (`trajflow replay --env-only`)."""

    async def run(
        name: str, env_id: str, script: list[str], max_new_tokens: int = 128, branch_at: int = 0, **request: Any
    ) -> Run:
        package = package_env(env_id, str(HARNESSES / name), store, cache_dir / "images", print)
        tokenizer = AutoTokenizer.from_pretrained(tiny_model)
        tokenizer.chat_template = TOOLS_TEMPLATE
        engine = ScriptedEngine(tokenizer, script, name="tiny")
        sampling = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
        async with running_stack(
            temporal_env, reward_service, store, sandbox_manager, engine, images=package_images
        ) as st:
            result = await st.run(
                st.request(env_id=env_id, env_package=package, task=name, sampling=sampling, **{"seed": 1, **request})
            )
            lines: list[str] = []
            replayed = await replay_env(st.client, st.store, result.workflow_id, 180, False, lines.append)
            branch = None
            if branch_at:  # `trajflow branch` / the client's: the branch samples its call k from the engine's script
                [handle] = await start_branches(result.workflow_id, branch_at, client=st.client, store=st.store)
                branched = await handle.result()
                assert branched.status is TrajectoryStatus.COMPLETED, branched.error
                branch = TrajectoryRecord.model_validate(store.get_json(branched.trajectory_uri))
        assert result.status is TrajectoryStatus.COMPLETED, result.error
        said = f"replayed {result.turns}/{result.turns} actions; the episode ended"
        assert replayed == 0 and said in "\n".join(lines), lines
        record = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri))
        requests = [json.loads(record.first_observation), *(json.loads(t.observation) for t in record.turns[:-1])]
        return Run(result, record, requests, "\n".join(lines).split("\n"), branch)

    return run


def assert_every_call_a_recorded_turn(run: Run, tiny_model: Path, script: list[str]) -> None:
    """The scripted episode ended with reward 1.0 after one turn per call, each holding the tokens sampled for it."""
    assert (run.result.turns, run.result.reward) == (len(script), 1.0), run.result
    assert run.record.turns[-1].observation == ""  # the program's exit ended the episode
    context = run.record.context
    assert context is not None and len(context.turn_spans) == len(script)
    assert all(turn.completion_tokens > 0 for turn in run.record.turns)
    assert sum(context.loss_mask) == sum(t.completion_tokens for t in run.record.turns)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    assert [tokenizer.decode(context.token_ids[a:b], skip_special_tokens=True) for a, b in context.turn_spans] == script


async def test_the_codex_cli_fixes_a_bug_and_its_verifier_scores_the_checks(harness, tiny_model) -> None:
    kwargs = {"verifier": "verify:checks_pass", "budget_s": 120}
    run = await harness("codex", COMMAND_ENV, CODEX_SCRIPT, max_turns=8, env_kwargs=kwargs)
    assert_every_call_a_recorded_turn(run, tiny_model, CODEX_SCRIPT)
    assert [(r["api"], r["stream"]) for r in run.requests] == [("openai.responses", True)] * 3
    assert all("exec_command" in [t["function"]["name"] for t in r["tools"]] for r in run.requests)
    assert "restock() in inventory.py" in run.requests[0]["messages"][-1]["content"]
    # Codex ran each command in the repository and sent its output back as the call's result
    said = run.requests[1]["messages"][-1]
    assert said["role"] == "tool" and ") - count" in said["content"]
    # the re-run asks the same first request (its cwd, in it, is the same path in every run); Codex's later requests
    # carry its tool results, each with a random chunk id and a wall time: equal once those are masked
    flat = run.replay
    shown = [
        (line.removeprefix("[observation] "), flat[i + 1])
        for i, line in enumerate(flat)
        if line[:15] == "[observation] {"
    ]
    recorded = [run.record.first_observation, *(t.observation for t in run.record.turns[:-1])]
    assert [codex_masked(request) for request, _ in shown] == [codex_masked(r) for r in recorded]
    assert shown[0][1] == "(same as recorded)" and "DIFFERS" in shown[1][1], [verdict for _, verdict in shown]


async def test_a_codex_turn_cut_at_max_tokens_is_scored_not_a_crash(harness) -> None:
    """Codex fails its turn on an answer cut at max tokens (an incomplete response) and exits 1: run.sh takes that for
    the policy's doing, so the episode is scored (0.0: the bug is still there), not an infrastructure failure."""
    long = ["I will start by reading every file of the repository, one after another, " * 4]
    kwargs = {"verifier": "verify:checks_pass", "budget_s": 120}
    run = await harness("codex", COMMAND_ENV, long, max_new_tokens=32, max_turns=8, env_kwargs=kwargs)
    assert (run.result.turns, run.result.reward) == (1, 0.0), run.result


async def test_claude_code_fixes_a_bug_and_its_verifier_scores_the_checks(harness, tiny_model) -> None:
    kwargs = {"verifier": "verify:words_fixed", "budget_s": 120}
    run = await harness("claude-code", COMMAND_ENV, CLAUDE_SCRIPT, max_turns=11, env_kwargs=kwargs)
    assert_every_call_a_recorded_turn(run, tiny_model, CLAUDE_SCRIPT)
    assert "DIFFERS" not in "\n".join(run.replay), "the re-run asked other than the record"
    assert [(r["api"], r["stream"]) for r in run.requests] == [("anthropic.messages", True)] * 3
    assert [sorted(t["function"]["name"] for t in r["tools"]) for r in run.requests] == [["Bash", "Edit", "Read"]] * 3
    assert [r["sampling"]["max_tokens"] for r in run.requests] == [32000] * 3  # it asks; the task's sampling caps it
    assert "count_words() in words.py" in run.requests[0]["messages"][-1]["content"]
    said = run.requests[1]["messages"][-1]  # Claude Code ran the command and sent its output back
    assert said["role"] == "tool" and 'split(" ")' in said["content"]


async def test_mini_swe_agent_fixes_a_bug_and_its_verifier_scores_the_tests(harness, tiny_model) -> None:
    kwargs = {"verifier": "verify:tests_pass", "budget_s": 120}
    run = await harness("mini-swe-agent", COMMAND_ENV, MINI_SCRIPT, max_turns=8, env_kwargs=kwargs)
    assert_every_call_a_recorded_turn(run, tiny_model, MINI_SCRIPT)
    assert "DIFFERS" not in "\n".join(run.replay), "the re-run asked other than the record"
    assert ["api" in r for r in run.requests] == [False] * 3  # Chat Completions, through litellm
    assert [[t["function"]["name"] for t in r["tools"]] for r in run.requests] == [["bash"]] * 3
    assert "Fix calc.py" in run.requests[0]["messages"][1]["content"]
    said = run.requests[1]["messages"][-1]  # mini ran the command in the repository and sent its output back
    assert said["role"] == "tool" and "len(values) + 1" in said["content"]
    roles = [m["role"] for m in run.requests[2]["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool"]


async def test_a_claude_code_trajectory_branches_at_a_call_and_differs_from_there(harness, tiny_model) -> None:
    """A branch at call 2 re-runs Claude Code in a fresh sandbox with call 1 answered from the parent's record (it must
    ask what the parent asked, by digest) and samples call 2 anew: the engine's next reply, which gives up where the
    parent fixed the bug."""
    kwargs = {"verifier": "verify:words_fixed", "budget_s": 120}
    gives_up = "I could not fix it."
    run = await harness(
        "claude-code", COMMAND_ENV, [*CLAUDE_SCRIPT, gives_up], branch_at=2, max_turns=11, env_kwargs=kwargs
    )
    branch = run.branch
    assert branch is not None and run.result.reward == 1.0 and branch.request.branch_of == run.result.workflow_id
    assert branch.first_observation == run.record.first_observation
    assert branch.turns[0].model_dump() == run.record.turns[0].model_dump()  # call 1: the parent's, answered as sent
    assert [t.action for t in branch.turns] == [run.record.turns[0].action, gives_up]
    assert branch.turns[-1].observation == "" and branch.reward == 0.0  # the words check still fails
    context = branch.context  # the parent's tokens through call 1, its own sample for call 2
    assert context is not None and run.record.context is not None and len(context.turn_spans) == 2
    end = run.record.context.turn_spans[0][1]
    assert context.token_ids[:end] == run.record.context.token_ids[:end]
    assert context.token_ids[end:] != run.record.context.token_ids[end : len(context.token_ids)]


@pytest.mark.parametrize("stream", [False, True])
async def test_the_agents_sdk_with_two_function_tools(harness, tiny_model, stream: bool) -> None:
    task = json.dumps({"stream": stream})
    run = await harness("agents-sdk", SDK_ENV, SDK_SCRIPT, seed=3, max_turns=6, env_kwargs={"task": task})
    assert_every_call_a_recorded_turn(run, tiny_model, SDK_SCRIPT)
    assert "DIFFERS" not in "\n".join(run.replay), "the re-run asked other than the record"
    assert [(r["api"], r["stream"]) for r in run.requests] == [("openai.responses", stream)] * 3
    assert [[t["function"]["name"] for t in r["tools"]] for r in run.requests] == [["add", "multiply"]] * 3
    first = run.requests[0]["messages"]
    assert first[0]["role"] == "system" and "calculator" in first[0]["content"]
    assert first[1] == {"role": "user", "content": "What is (5 + 3) * 2?"}
    # the SDK ran each tool and sent its result back: the third request holds both calls and both results
    assert [(m["role"], m.get("content")) for m in run.requests[2]["messages"][2:]] == [
        ("assistant", None), ("tool", "8"), ("assistant", None), ("tool", "16"),
    ]  # fmt: skip


def tiny_config(example: Path, tmp_path: Path, train: str) -> Path:
    """The example's config with the stack's tiny model (same template, task, program and reward) and `train`."""
    text = (example / "config.toml").read_text().split("\n[train]\n")[0]
    text = text.replace('name_or_path = "smollm2"', 'name_or_path = "tiny"')
    text = text.replace('env_path = "."', f'env_path = "{example}"')
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
    config = tiny_config(HARNESSES / "agents-sdk", tmp_path, train)
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
