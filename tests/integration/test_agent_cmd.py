"""Agent programs as command lines (`agent-cmd:FILE`) through the whole stack: `#!/bin/sh` programs packed with their
execute bits, run as is in the hardened sandbox against its OpenAI-compatible endpoint (through a python3 helper beside
them: the image has no curl), every chat request a turn of the TrajectoryWorkflow on the decode pool (a scripted
policy on the real tokenizer), the reward from the program's reward file; a killed sandbox is restored by re-running
the command with its recorded answers; a non-zero exit status ends the trajectory
`infra_failed` as `crashed` with its stderr, status 0 without a reward file as `bad_result`. `trajflow train` and
`rollout` refuse a bad command at submission with exit 2. A verifier (`check.py`) run after a program that left
its answer in a file of its work directory gives the reward.

The programs are `tests/integration/agent_cmd_programs/` (sh and stdlib python3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tests.conftest import running_stack, submitted_offline
from tests.integration.test_agent_trajectory import run_killing_its_sandbox
from tests.integration.test_trajectory import GatedEngine
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.trajectory import SamplingParams, TrajectoryStatus
from trajflow.rl.engines.scripted import ScriptedEngine
from trajflow.sandbox.user.submit import package_env
from trajflow.sandbox.user_images import USER_ROOT

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).parent / "agent_cmd_programs"
SAMPLING = SamplingParams(temperature=0.0, max_new_tokens=16)


@pytest.fixture()
def package(store, cache_dir) -> str:
    return package_env("agent-cmd:ask.sh", str(PROGRAMS), store, cache_dir / "images", print, {"args": "--polite"})


def request(st, package: str, file: str, **env_kwargs):
    return st.request(
        env_id=f"agent-cmd:{file}", env_package=package, seed=5, sampling=SAMPLING, task="agent", max_turns=4,
        env_kwargs=env_kwargs,
    )  # fmt: skip


async def test_a_shell_program_completes_with_the_reward_from_its_reward_file(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, package, docker_client
) -> None:
    image = package_images.image_for("agent-cmd:ask.sh", package)
    modes = docker_client.containers.run(
        image, ["stat", "-c", "%n %a", "ask.sh", "post.py"], entrypoint=[], working_dir=USER_ROOT, remove=True
    )
    assert modes.decode().split("\n")[:2] == ["ask.sh 755", "post.py 644"], "the layer lost the execute bits"
    engine = ScriptedEngine(AutoTokenizer.from_pretrained(tiny_model), ["maybe", "yes"])
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images) as st:
        result = await st.run(request(st, package, "ask.sh", task="is it?", args="--polite"))
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert (result.turns, result.reward) == (2, 1.0)
    record = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri))
    first = json.loads(record.first_observation)
    assert first["messages"] == [{"role": "user", "content": 'question 5: "is it?" --polite'}]
    second = json.loads(record.turns[0].observation)  # the program's next request extends its first
    assert [m["content"] for m in second["messages"]] == ['question 5: "is it?" --polite', "maybe", "sure?"]
    assert [t.action for t in record.turns] == ["maybe", "yes"]
    assert record.turns[1].observation == "" and record.turns[1].env_reward == 1.0


async def test_a_killed_sandbox_reruns_the_command_with_its_recorded_answers(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, package, docker_client
) -> None:
    engine = GatedEngine(ScriptedEngine(AutoTokenizer.from_pretrained(tiny_model), ["maybe", "yes"]), gate_at=1)
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images) as st:
        req = request(st, package, "ask.sh", task="is it?")
        result = await run_killing_its_sandbox(st, req, engine, sandbox_manager, docker_client)
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert (result.turns, result.reward, result.env_recoveries) == (2, 1.0, 1)
    assert engine.calls == 2, "the restored program's first call was answered from the record, not decoded"


async def test_a_verifier_gives_the_reward_from_the_file_the_program_left(
    temporal_env, reward_service, store, cache_dir, sandbox_manager, tiny_model, package_images
) -> None:
    kwargs = {"verifier": "check:verify"}
    package = package_env("agent-cmd:edit.sh", str(PROGRAMS), store, cache_dir / "images", print, kwargs)
    engine = ScriptedEngine(AutoTokenizer.from_pretrained(tiny_model), ["fixed"])
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images) as st:
        result = await st.run(request(st, package, "edit.sh", **kwargs))
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert (result.turns, result.reward) == (1, 1.0)  # no reward file: without its verifier, a bad_result
    record = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri))
    assert record.turns[0].observation == "" and record.turns[0].env_reward == 1.0


@pytest.mark.parametrize(
    ("file", "says"),
    [
        ("fail.sh", "crashed"),
        ("silent.sh", "bad_result"),
    ],
)
async def test_a_failing_command_ends_infra_failed_saying_which(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, package_images, package, file, says
) -> None:
    engine = ScriptedEngine(AutoTokenizer.from_pretrained(tiny_model), ["fine"])
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=package_images) as st:
        result = await st.run(request(st, package, file))
    assert result.status is TrajectoryStatus.INFRA_FAILED and result.reward is None, result
    assert says in (result.error or ""), result.error
    if file == "fail.sh":
        assert "exited with status 3" in (result.error or "") and "the agent broke here" in (result.error or "")
    else:
        assert "without writing its reward file" in (result.error or "")


@pytest.mark.parametrize(
    ("env_id", "args", "says"),
    [
        ("agent-cmd:notes.txt", "", "is neither executable nor a script with a #! line"),
        ("agent-cmd:absent.sh", "", "does not exist"),
        ("agent-cmd:run.sh", "'unclosed", "cannot be split as a shell would"),
    ],
    ids=["not-executable", "missing", "bad-args"],
)
def test_a_bad_command_is_refused_at_submission(tmp_path: Path, env_id: str, args: str, says: str) -> None:
    env = tmp_path / "agent"
    env.mkdir()
    (env / "notes.txt").write_text("no #! line, no execute bit\n")
    (env / "run.sh").write_text("#!/bin/sh\n")
    config = tmp_path / "bad.toml"
    config.write_text(
        f'[[tasks]]\nname = "mine"\nenv_id = "{env_id}"\nenv_path = "{env}"\nenv_kwargs = {{ args = "{args}" }}\n'
    )
    for proc in submitted_offline(config, tmp_path / "state"):
        assert proc.returncode == 2, proc.stderr
        assert says in proc.stderr, proc.stderr
