"""TrajectoryWorkflow end to end: real Temporal dev server, real Docker sandboxes running GEM, the real reward
service over HTTP, a real (tiny, random) HF policy or a scripted one where a test needs a known action sequence.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from tests.conftest import running_stack
from trajflow.contracts import names
from trajflow.contracts.records import TrajectoryRecord
from trajflow.contracts.trajectory import StagePools, TrajectoryStatus

pytestmark = pytest.mark.integration

OUT_OF_RANGE = "I guess \\boxed{999}"  # a valid-format guess outside the range: the game goes on until its limit


class GatedEngine:
    """Wraps an engine and holds its `gate_at`-th call (0-based) until released, so a test can act mid-episode."""

    def __init__(self, inner, gate_at: int) -> None:
        self.inner = inner
        self.gate_at = gate_at
        self.calls = 0
        self.reached = asyncio.Event()
        self.released = asyncio.Event()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    async def generate(self, prompt_ids, params, policy=""):
        call, self.calls = self.calls, self.calls + 1
        if call == self.gate_at:
            self.reached.set()
            await self.released.wait()
        return await self.inner.generate(prompt_ids, params, policy)


@pytest.fixture(scope="module")
async def hf_engine(tiny_model):
    from trajflow.rl.engines.hf import HFEngine

    engine = HFEngine(tiny_model, max_batch=16, batch_wait_ms=20)
    await engine.start()
    yield engine
    await engine.close()


@pytest.fixture()
def scripted(tiny_model):
    from transformers import AutoTokenizer

    from trajflow.rl.engines.scripted import ScriptedEngine

    return ScriptedEngine(AutoTokenizer.from_pretrained(tiny_model), OUT_OF_RANGE)


def load_record(store, uri: str | None) -> TrajectoryRecord:
    assert uri is not None, "the trajectory saved no record"
    return TrajectoryRecord.model_validate(store.get_json(uri))


async def test_trajectory_with_a_real_policy_completes_and_is_stored(
    temporal_env, reward_service, store, sandbox_manager, hf_engine
):
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, hf_engine) as stack:
        result = await stack.run(stack.request(seed=7))
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert 1 <= result.turns <= 8
    assert result.policy_version == 0
    record = load_record(store, result.trajectory_uri)
    assert "Guess The Number" in record.first_observation
    # the default reward (env_outcome) is the sum of the env's own rewards, computed by the service
    assert result.reward == pytest.approx(sum(t.env_reward for t in record.turns))
    ctx = record.context
    assert ctx is not None
    assert len(ctx.token_ids) == len(ctx.logprobs) == len(ctx.loss_mask)
    assert sum(ctx.loss_mask) == sum(t.completion_tokens for t in record.turns)
    assert ctx.turn_versions == [0] * result.turns
    assert all(lp <= 0.0 for lp, m in zip(ctx.logprobs, ctx.loss_mask, strict=True) if m)


async def test_killed_container_is_restored_by_replay_and_the_episode_finishes(
    temporal_env, reward_service, store, sandbox_manager, docker_client, scripted
):
    engine = GatedEngine(scripted, gate_at=2)
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as stack:
        req = stack.request(env_id="game:GuessTheNumber-v0-hard", seed=3, env_kwargs={"max_turns": 6}, max_turns=6)
        handle = await stack.start(req)
        await asyncio.wait_for(engine.reached.wait(), 60)
        progress = await handle.query(names.QUERY_PROGRESS)
        assert progress["turn"] == 2
        container_id = sandbox_manager.get(progress["sandbox"]).container_id
        docker_client.containers.get(container_id).kill()
        engine.released.set()
        result = await handle.result()
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert result.env_recoveries == 1
    assert result.turns == 6
    record = load_record(store, result.trajectory_uri)
    # The fresh sandbox was restored to the same state: the game's own turn counter continues without a gap.
    for i, turn in enumerate(record.turns[:-1]):
        assert f"At turn {i + 1}, you guessed 999" in turn.observation
    assert "maximum number of turns" in record.turns[-1].observation


async def test_recovery_budget_spent_ends_infra_failed_and_unscored(
    temporal_env, reward_service, store, sandbox_manager, docker_client, scripted
):
    engine = GatedEngine(scripted, gate_at=1)
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as stack:
        req = stack.request(env_id="game:GuessTheNumber-v0-hard", seed=4, max_env_recoveries=0)
        handle = await stack.start(req)
        await asyncio.wait_for(engine.reached.wait(), 60)
        progress = await handle.query(names.QUERY_PROGRESS)
        docker_client.containers.get(sandbox_manager.get(progress["sandbox"]).container_id).kill()
        engine.released.set()
        result = await handle.result()
    assert result.status is TrajectoryStatus.INFRA_FAILED
    assert result.reward is None  # never a zero reward
    assert "SandboxLost" in (result.error or "")
    record = load_record(store, result.trajectory_uri)
    assert record.status is TrajectoryStatus.INFRA_FAILED and record.reward is None


async def test_twenty_turn_history_stays_small(temporal_env, reward_service, store, sandbox_manager, scripted):
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, scripted) as stack:
        req = stack.request(env_id="game:GuessTheNumber-v0-hard", seed=1, env_kwargs={"max_turns": 20}, max_turns=20)
        handle = await stack.start(req)
        result = await handle.result()
        history = await handle.fetch_history()
    assert result.status is TrajectoryStatus.COMPLETED and result.turns == 20
    text = history.to_json()
    events = len(history.events)
    size = sum(e.ByteSize() for e in history.events)  # what the server stores (protobuf)
    largest = max(e.ByteSize() for e in history.events)
    print(
        f"\n20-turn trajectory history: {events} events, {size / 1024:.1f} KiB, largest event {largest / 1024:.1f} KiB"
    )
    assert events < 20 * 15  # O(turns): a handful of events per turn (one an upsert keeping TrajflowTurns current)
    assert size < 128 * 1024
    assert largest < 16 * 1024
    assert "token_ids" not in text and "logprobs" not in text  # the data plane stays in the store
    record = load_record(store, result.trajectory_uri)
    assert record.context is not None
    assert len(record.context.turn_spans) == 20
    # the store side stays O(turns) too: each turn writes what it adds to the token context, not the whole context
    contexts = sorted(u for u in store.list("trajectories/") if "/context-turn" in u)
    sizes = [len(store.get_bytes(u)) for u in contexts]
    print(f"bytes written per turn: {sizes}")
    assert len(sizes) == 20
    assert max(sizes[1:]) <= 1.5 * min(sizes[1:]), f"a turn's write grows with the turn number: {sizes}"


async def test_two_tasks_send_llm_steps_to_their_own_decode_pools(
    temporal_env, reward_service, store, sandbox_manager, scripted
):
    a, b = f"a{uuid.uuid4().hex[:6]}", f"b{uuid.uuid4().hex[:6]}"
    async with running_stack(
        temporal_env, reward_service, store, sandbox_manager, scripted, decode_pools={a: scripted, b: scripted}
    ) as stack:
        reqs = [
            stack.request(seed=1, max_turns=2, pools=StagePools(decode=a, env=stack.pools, reward=stack.pools)),
            stack.request(seed=2, max_turns=2, pools=StagePools(decode=b, env=stack.pools, reward=stack.pools)),
        ]
        results = await asyncio.gather(*(stack.run(r) for r in reqs))
    for pool, result in zip((a, b), results, strict=True):
        assert result.status is TrajectoryStatus.COMPLETED, result.error
        assert {t.decode_pool for t in load_record(store, result.trajectory_uri).turns} == {pool}


async def test_unknown_env_fails_as_env_error_not_infra(temporal_env, reward_service, store, sandbox_manager, scripted):
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, scripted) as stack:
        result = await stack.run(stack.request(env_id="game:NoSuchGame-v0"))
    assert result.status is TrajectoryStatus.FAILED
    assert result.reward is None and result.env_recoveries == 0
    assert "NoSuchGame" in (result.error or "")


async def test_concurrent_trajectories_share_decode_batches(
    temporal_env, reward_service, store, sandbox_manager, tiny_model
):
    from trajflow.rl.engines.hf import HFEngine

    # A generous batching window: sandboxes start at slightly different times, and the point here is that
    # turns of different trajectories that are waiting together go into one forward pass.
    engine = HFEngine(tiny_model, max_batch=16, batch_wait_ms=1000)
    await engine.start()
    try:
        async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as stack:
            results = await asyncio.gather(*(stack.run(stack.request(seed=100 + i, max_turns=2)) for i in range(8)))
        after = engine.stats()
    finally:
        await engine.close()
    assert all(r.status is TrajectoryStatus.COMPLETED for r in results), [r.error for r in results]
    requests, batches = after["requests"], after["batches"]
    print(f"\n8 concurrent trajectories: {requests:.0f} LLM requests in {batches:.0f} engine batches")
    assert requests == sum(r.turns for r in results)
    assert batches < requests
    json.dumps(after)  # stats are plain numbers


async def test_a_reasoning_gym_env_runs_through_the_same_path(
    temporal_env, reward_service, store, sandbox_manager, hf_engine
):
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, hf_engine) as stack:
        result = await stack.run(stack.request(env_id="rg:basic_arithmetic", seed=5, max_turns=2))
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    record = load_record(store, result.trajectory_uri)
    assert record.first_observation.strip() and result.turns >= 1


async def test_a_dead_env_host_is_noticed_by_schedule_to_start_and_another_host_restores_the_episode(
    temporal_env, reward_service, store, sandbox_manager, scripted
):
    from trajflow.contracts import names
    from trajflow.workers.env import env_workers

    engine = GatedEngine(scripted, gate_at=2)
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, engine) as stack:
        req = stack.request(env_id="game:GuessTheNumber-v0-hard", seed=5, env_kwargs={"max_turns": 4}, max_turns=4)
        handle = await stack.start(req)
        await asyncio.wait_for(engine.reached.wait(), 60)
        dead = await handle.query(names.QUERY_PROGRESS)
        # the env host dies: nothing polls its host queue or takes resets any more; a second host serves the pool
        mine = {dead["host_queue"], names.env_queue(stack.pools)}
        await asyncio.gather(*(w.shutdown() for w in stack.workers if w.task_queue in mine))
        second = env_workers(stack.client, sandbox_manager, [stack.pools], f"second-{stack.tag}", step_timeout_s=30)
        running = [asyncio.create_task(w.run()) for w in second]
        try:
            engine.released.set()
            result = await asyncio.wait_for(handle.result(), 180)
            after = await handle.query(names.QUERY_PROGRESS)
        finally:
            await asyncio.gather(*(w.shutdown() for w in second), return_exceptions=True)
            await asyncio.gather(*running, return_exceptions=True)
            sandbox_manager.close(dead["sandbox"])  # the dead host's container (its reaper would remove it)
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert result.env_recoveries == 1 and result.turns == 4
    assert after["host_queue"] is None  # closed at the end; the restored sandbox lived on the second host
    record = load_record(store, result.trajectory_uri)
    # restored by replay on the second host: the game's own turn counter goes on without a gap
    for i, turn in enumerate(record.turns[:-1]):
        assert f"At turn {i + 1}, you guessed 999" in turn.observation


class FailingImages:
    """An image resolver whose builds fail `failures` times (then resolve as the real one does): the env worker's
    handling of a failed image build, without breaking the machine's real image cache."""

    def __init__(self, image: str, failures: int) -> None:
        self.image = image
        self.failures = failures
        self.calls = 0

    def image_for(self, env_id: str, package: str = "") -> str:
        from trajflow.sandbox.errors import ImageBuildError

        self.calls += 1
        if self.calls <= self.failures:
            raise ImageBuildError(f"cannot build the image for {env_id!r}: injected build failure {self.calls}")
        return self.image


async def test_an_image_build_failure_is_retried_and_past_the_budget_ends_infra_failed_unscored(
    temporal_env, reward_service, store, sandbox_manager, scripted
):
    once = FailingImages(sandbox_manager.image, failures=1)
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, scripted, images=once) as stack:
        result = await stack.run(stack.request(env_id="game:GuessTheNumber-v0-hard", seed=6, max_turns=2))
    assert result.status is TrajectoryStatus.COMPLETED, result.error
    assert once.calls == 2 and result.env_recoveries == 0  # the activity's own retry built it on a second try
    always = FailingImages(sandbox_manager.image, failures=10**6)
    async with running_stack(temporal_env, reward_service, store, sandbox_manager, scripted, images=always) as stack:
        req = stack.request(env_id="game:GuessTheNumber-v0-hard", seed=6, max_turns=2, max_env_recoveries=1)
        result = await stack.run(req)
    assert result.status is TrajectoryStatus.INFRA_FAILED and result.reward is None
    assert "ImageBuildError" in (result.error or "") and "injected build failure" in (result.error or "")
    assert always.calls == 6  # (1 + max_env_recoveries) resets x 3 activity attempts, then it stops
