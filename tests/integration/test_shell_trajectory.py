"""Shell tasks through the whole stack: TrajectoryWorkflow -> decode (a scripted policy) -> env.reset on the task's
own image layer, built on first use -> shell commands in the hardened sandbox -> the task's tests as the reward,
via the real reward service. Escape attempts are contained inside the episode and end it in a clear status."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tests.conftest import running_stack
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.trajectory import SamplingParams, TrajectoryStatus
from trajflow.envs.shell import WORK_DIR
from trajflow.rl.engines.scripted import ScriptedEngine
from trajflow.sandbox import labels
from trajflow.sandbox.images import SHELL_TASKS_DIR, ImageResolver

pytestmark = pytest.mark.integration

TASK = "roman-numerals"
LONG = SamplingParams(temperature=0.0, max_new_tokens=1024)  # room for a whole script in one reply


def bash(command: str) -> str:
    return f"I will run this.\n```bash\n{command}\n```"


@pytest.fixture(scope="module")
def images(docker_client, cache_dir):
    return ImageResolver(docker_client, cache_dir / "images")


def scripted(tiny_model, replies: list[str]) -> ScriptedEngine:
    return ScriptedEngine(AutoTokenizer.from_pretrained(tiny_model), replies)


async def test_an_agent_that_fixes_the_bug_gets_reward_one(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, images
) -> None:
    solution = (SHELL_TASKS_DIR / TASK / "solution.sh").read_text()
    engine = scripted(
        tiny_model, [bash("python3 -m unittest discover -s tests 2>&1 | tail -1"), bash(solution), "submit"]
    )
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=images) as st:
        result = await st.run(st.request(env_id=f"shell:{TASK}", seed=0, sampling=LONG, max_turns=6))
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert result.reward == 1.0 and result.turns == 3 and result.env_recoveries == 0
    record = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri))
    assert "from_roman" in record.first_observation  # the task's description is the first observation
    assert "FAILED" in record.turns[0].observation  # the bug is real: its tests fail before the fix
    assert record.turns[-1].observation.endswith("tests passed")


async def test_an_agent_that_does_not_fix_it_gets_zero_not_an_infra_failure(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, images
) -> None:
    engine = scripted(tiny_model, [bash("echo 'def from_roman(t): return 0' >> roman.py"), "submit"])
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=images) as st:
        result = await st.run(st.request(env_id=f"shell:{TASK}", seed=0, sampling=LONG, max_turns=4))
    assert result.status is TrajectoryStatus.COMPLETED and result.reward == 0.0


async def test_escape_attempts_are_contained_and_the_episode_ends_scored(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, images, docker_client
) -> None:
    attempts = [
        bash("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)\""),
        bash("echo pwned > /etc/pwned; echo pwned > /opt/trajflow/runner.py"),
        bash("bomb() { bomb | bomb & }; bomb"),
        bash("python3 -c \"x = bytearray(2 * 1024 ** 3); print('allocated')\""),
        bash("sleep infinity"),
        bash(f"ls {WORK_DIR}/repo"),  # the sandbox still answers after all of that
        "submit",
    ]
    engine = scripted(tiny_model, attempts)

    def ours() -> set[str]:  # this stack's sandboxes (another stack on the engine may start its own meanwhile)
        owned = {"label": f"{labels.OWNER}={sandbox_manager.owner_id}"}
        return {c.id for c in docker_client.containers.list(all=True, filters=owned)}

    before = ours()
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=images) as st:
        req = st.request(
            env_id=f"shell:{TASK}", seed=0, sampling=LONG, max_turns=10, env_kwargs={"command_timeout_s": 3}
        )
        result = await st.run(req)
    # contained inside the episode: no sandbox was lost, the agent is scored (the bug is still there: 0)
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert result.env_recoveries == 0 and result.turns == len(attempts) and result.reward == 0.0
    obs = [t.observation for t in TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri)).turns]
    assert "unreachable" in obs[0].lower() and "[exit 1]" in obs[0]
    assert "Read-only" in obs[1] or "Permission denied" in obs[1]
    # past the memory limit: refused, OOM-killed, or thrashing until the command timeout kills it
    assert "allocated" not in obs[3] and any(m in obs[3] for m in ("MemoryError", "[killed by signal 9]", "timed out"))
    assert "timed out after 3s" in obs[4]
    assert "roman.py" in obs[5] and "[exit 0]" in obs[5]
    # the host is unharmed: nothing was written outside the container, and its sandbox is gone
    assert not Path("/etc/pwned").exists()
    assert not (ours() - before), "the episode's sandbox outlived it"


async def test_a_hung_step_kills_its_container_and_past_the_budget_ends_infra_failed(
    temporal_env, reward_service, store, docker_client, tiny_model, images, sandbox_manager, tmp_path
) -> None:
    """A step that outlives the sandbox's step timeout (here a command allowed longer than the step) has its
    container killed; the fresh sandbox hangs the same way, so the trajectory ends infra-failed, never scored."""
    import tempfile

    from trajflow.sandbox.manager import SandboxManager

    short = SandboxManager(
        docker_client, sandbox_manager.image, Path(tempfile.mkdtemp(prefix="tf-hung-")), "test-hung", step_timeout_s=2
    )
    engine = scripted(tiny_model, [bash("sleep 20")])
    try:
        async with running_stack(temporal_env, reward_service, store, short, engine, images=images) as st:
            req = st.request(
                env_id=f"shell:{TASK}", seed=0, max_turns=3, max_env_recoveries=1, env_kwargs={"command_timeout_s": 60}
            )
            result = await st.run(req)
    finally:
        short.close_all()
    assert result.status is TrajectoryStatus.INFRA_FAILED and result.reward is None
    assert result.env_recoveries == 2 and "exceeded its 2s timeout; the container was killed" in (result.error or "")
    assert not docker_client.containers.list(all=True, filters={"label": "trajflow.owner=test-hung"})
