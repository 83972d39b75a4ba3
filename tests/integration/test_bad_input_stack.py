"""Bad input through the whole stack (issue 5): real Docker sandboxes, a scripted policy, a real HTTP reward service.

An unknown env id ends the trajectory `failed` after one `env.reset`, saying how to find valid ids; a reward
service that answers garbage (not JSON, the wrong shape, a NaN or infinite reward, an oversized answer) ends it
`failed` (never infra-failed, never scored, so never trained on) after one `reward.score`, naming the service's
URL and what was wrong; an agent that prints 10 MB gets a cut observation with a marker, and the episode is scored.
The workflow-input, signal and payload-limit cases live in tests/integration/test_bad_input.py.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
from collections.abc import Iterator

import pytest
from temporalio.api.enums.v1 import EventType
from transformers import AutoTokenizer

from tests.conftest import running_stack
from trajflow.contracts import names
from trajflow.contracts.limits import MAX_OBSERVATION_CHARS
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.trajectory import SamplingParams, TrajectoryStatus
from trajflow.rl.engines.scripted import ScriptedEngine
from trajflow.sandbox.images import ImageResolver

pytestmark = pytest.mark.integration

GARBAGE: dict[int, tuple[bytes, str]] = {
    # seed -> (the body the "reward service" answers with 200, what the error must say)
    1: (b"<html><body>502 Bad Gateway</body></html>", "Invalid JSON"),
    2: (b'{"score": 1.0}', "reward: Field required"),
    3: (b'{"reward": NaN, "reward_fn": "env_outcome"}', "reward: Input should be a finite number"),
    4: (b'{"reward": Infinity, "reward_fn": "env_outcome"}', "reward: Input should be a finite number"),
    5: (
        b'{"reward": 1.0, "reward_fn": "env_outcome", "details": {"blob": "' + b"x" * 100_000 + b'"}}',
        "more than the 65,536",
    ),
}


class _Garbage(http.server.BaseHTTPRequestHandler):
    """A reward service gone wrong: answers POST /score with 200 and the garbage GARBAGE holds for the seed."""

    def do_POST(self) -> None:
        seed = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))["seed"]
        body = GARBAGE[seed][0]
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def garbage_service() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def scripted(tiny_model, replies: str | list[str]) -> ScriptedEngine:
    return ScriptedEngine(AutoTokenizer.from_pretrained(tiny_model), replies)


async def attempts(client, workflow_id: str, activity_name: str) -> list[int]:
    """The attempt number of every start of `activity_name` in the workflow's history."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    scheduled = {
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == activity_name
    }
    return [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.scheduled_event_id in scheduled
    ]


async def test_an_unknown_env_id_fails_after_one_reset_saying_how_to_find_valid_ids(
    temporal_env, reward_service, store, sandbox_manager, tiny_model
):
    async with running_stack(
        temporal_env, reward_service, store, sandbox_manager, scripted(tiny_model, "\\boxed{5}")
    ) as st:
        result = await st.run(st.request(env_id="game:NoSuchGame-v0", seed=1))
        tries = await attempts(st.client, result.workflow_id, names.ENV_RESET)
    print(f"\n{result.status.value}: {result.error}")
    assert result.status is TrajectoryStatus.FAILED and result.reward is None and result.env_recoveries == 0
    assert tries == [1]  # non-retryable: one reset (one container), not three
    error = result.error or ""
    assert "env.reset: EnvError" in error and "UnknownEnv" in error and "'game:NoSuchGame-v0'" in error
    assert "ENV_REGISTRY" in error and "trajflow/envs/shell_tasks" in error  # how to find the valid ones


async def test_a_reward_service_answering_garbage_fails_the_trajectory_unscored_after_one_attempt(
    temporal_env, garbage_service, store, sandbox_manager, tiny_model
):
    import asyncio

    engine = scripted(tiny_model, "\\boxed{5}")
    async with running_stack(temporal_env, garbage_service, store, sandbox_manager, engine) as st:
        results = await asyncio.gather(*(st.run(st.request(seed=seed, max_turns=1)) for seed in GARBAGE))
        tries = [await attempts(st.client, r.workflow_id, names.REWARD_SCORE) for r in results]
    for seed, result, n in zip(GARBAGE, results, tries, strict=True):
        print(f"\nseed {seed}: {result.status.value}: {(result.error or '')[:400]}")
        assert result.status is TrajectoryStatus.FAILED, result  # the service's fault: not infra, not retried
        assert result.reward is None and n == [1]
        error = result.error or ""
        assert f"reward.score: {names.ERR_REWARD_BAD_ANSWER}" in error and garbage_service in error
        assert GARBAGE[seed][1] in error
        record = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri))
        assert record.status is TrajectoryStatus.FAILED and record.reward is None  # stored, never trainable


async def test_an_agent_that_prints_ten_megabytes_gets_a_cut_observation_and_is_scored(
    temporal_env, reward_service, store, sandbox_manager, tiny_model, docker_client, cache_dir
):
    images = ImageResolver(docker_client, cache_dir / "images")
    flood = "I will run this.\n```bash\npython3 -c \"print('y' * 10_000_000)\"\n```"
    engine = scripted(tiny_model, [flood, "submit"])
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine, images=images) as st:
        req = st.request(
            env_id="shell:roman-numerals",
            env_kwargs={"max_output": 20_000_000},  # the shell task's own cut (2000 by default) out of the way
            sampling=SamplingParams(temperature=0.0, max_new_tokens=256),
            max_turns=3,
        )
        result = await st.run(req)
    print(f"\n{result.status.value} reward {result.reward}: {result.error}")
    assert result.status is TrajectoryStatus.COMPLETED and result.reward == 0.0  # an episode like any other
    observation = TrajectoryRecord.model_validate(store.get_json(result.trajectory_uri)).turns[0].observation
    assert len(observation) <= MAX_OBSERVATION_CHARS + 200
    assert re.search(r"\[\.\.\. trajflow cut 99\d{5} characters of this observation \.\.\.\]", observation)
    assert observation.startswith("yyyy")
