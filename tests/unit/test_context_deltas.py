"""A trajectory's token context in the store: each turn writes only what it adds, so the bytes written grow linearly
with the turns, and the record `trajectory.save` assembles is the context the turns built, whichever decode worker
ran each turn (activity level: the real decode and save activities, a real local store, no Temporal server).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment
from transformers import AutoTokenizer

from trajflow.activities.decode import DecodeActivities
from trajflow.activities.reward import RewardActivities
from trajflow.contracts.records import TrajectoryRecord, TurnContext
from trajflow.contracts.trajectory import (
    SaveTrajectoryInput,
    TrajectoryRequest,
    TrajectoryStatus,
    TurnSummary,
)
from trajflow.infra.store import LocalStore
from trajflow.rl.chat import append_completion, append_user
from trajflow.rl.engines.scripted import ScriptedEngine
from trajflow.rl.models import build_tiny_model

TURNS = 20
ACTION = "I guess \\boxed{999}"


class CountingStore(LocalStore):
    """A local store that remembers how many bytes each write put, in order."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.writes: list[tuple[str, int]] = []

    def put_bytes(self, key: str, data: bytes) -> str:
        self.writes.append((key, len(data)))
        return super().put_bytes(key, data)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("deltas") / "tiny"))


def observation(turn: int) -> str:
    return f"Turn {turn}: your guess 999 is outside the range 1 to 1000. Guess again, with one number in \\boxed{{}}."


async def run_turns(decoders: list[DecodeActivities], req: TrajectoryRequest, traj: str) -> list[str]:
    """Run TURNS decode turns, turn i on decoders[i % len(decoders)]; return each turn's context URI."""
    env = ActivityEnvironment()
    uris: list[str] = []
    uri: str | None = None
    for turn in range(TURNS):
        decoder = decoders[turn % len(decoders)]
        gen = await env.run(decoder.generate, req.generate_input(traj, turn, uri, observation(turn)))
        uri = gen.context_uri
        uris.append(uri)
    return uris


def expected_context(tokenizer: Any, engine_name: str, req: TrajectoryRequest) -> TurnContext:
    """The context built in memory, turn by turn, exactly as one decode worker that never forgets would."""
    ctx = TurnContext(model=engine_name)
    ids = tokenizer.encode(ACTION, add_special_tokens=False) + [tokenizer.eos_token_id]
    for turn in range(TURNS):
        ctx, _ = append_user(ctx, tokenizer, observation(turn), req.system_prompt)
        ctx = append_completion(ctx, ids, [0.0] * len(ids), ACTION, 0)
    return ctx


async def save(store: CountingStore, req: TrajectoryRequest, context_uri: str) -> TrajectoryRecord:
    turn = TurnSummary(
        action=ACTION, observation="o", env_reward=0.0, policy_version=0, completion_tokens=1, decode_pool="p"
    )
    inp = SaveTrajectoryInput(
        workflow_id="w", request=req, status=TrajectoryStatus.COMPLETED, context_uri=context_uri,
        first_observation=observation(0), turns=[turn] * TURNS, reward=0.0, env_recoveries=0,
    )  # fmt: skip
    saved = await ActivityEnvironment().run(RewardActivities(None, store).save, inp)  # type: ignore[arg-type]
    return TrajectoryRecord.model_validate(store.get_json(saved.trajectory_uri))


def decoder(tokenizer: Any, store: CountingStore, worker: str) -> DecodeActivities:
    return DecodeActivities(ScriptedEngine(tokenizer, ACTION), store, "p", worker)


async def test_each_turn_writes_only_what_it_adds(tokenizer: Any, tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "store")
    req = TrajectoryRequest()
    await run_turns([decoder(tokenizer, store, "a")], req, "traj-1/run-1")
    per_turn = [size for _, size in store.writes]
    print(f"\nbytes written per turn: {per_turn}")
    assert len(per_turn) == TURNS
    # Turn 0 carries the system prompt; every later turn adds one observation and one completion of the same length.
    later = per_turn[1:]
    assert max(later) <= 1.2 * min(later), f"a turn's write grows with the turn number: {per_turn}"
    assert sum(per_turn) <= TURNS * 2 * per_turn[0]


async def test_the_saved_record_is_the_context_the_turns_built_on_any_worker(tokenizer: Any, tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "store")
    req = TrajectoryRequest()
    # Turns alternate between two decode workers, and a third one that has never seen this trajectory (a worker
    # restart) takes every third turn: each must read what it lacks from the store.
    workers = [decoder(tokenizer, store, "a"), decoder(tokenizer, store, "b"), decoder(tokenizer, store, "c")]
    uris = await run_turns(workers, req, "traj-2/run-1")
    record = await save(store, req, uris[-1])
    assert record.context == expected_context(tokenizer, "scripted", req)
    # a fresh worker (nothing in memory) given a middle turn's context sees that turn's context, not a later one
    fresh = decoder(tokenizer, store, "d")
    gen = await ActivityEnvironment().run(
        fresh.generate, req.generate_input("traj-2/run-2", 5, uris[4], observation(5))
    )
    branched = await save(store, req, gen.context_uri)
    assert branched.context is not None and len(branched.context.turn_spans) == 6
    assert record.context is not None
    assert branched.context.token_ids == record.context.token_ids[: branched.context.turn_spans[-1][1]]


def test_a_whole_context_written_before_deltas_is_still_read(tmp_path: Path) -> None:
    from trajflow.activities.contexts import ContextStore
    from trajflow.contracts.records import ChatMessage, TurnDelta

    store = LocalStore(tmp_path / "store")
    old = TurnContext(
        messages=[ChatMessage(role="user", content="hi")], token_ids=[1, 2], logprobs=[0.0, 0.0], loss_mask=[0, 0]
    )
    old_uri = store.put_json("trajectories/t/r/context-turn000.json", old)
    after = old.model_copy(update={"token_ids": [1, 2, 3], "logprobs": [0.0, 0.0, -1.0], "loss_mask": [0, 0, 1],
                                   "turn_versions": [0], "turn_spans": [(2, 3)]})  # fmt: skip
    uri = ContextStore(store).save("trajectories/t/r/context-turn001.json", old_uri, old, after)
    assert ContextStore(store).load(uri) == after
    with pytest.raises(ValueError, match="cannot extend"):
        TurnDelta.between(old, after, None).apply(after)


async def test_a_retried_turn_writes_its_own_delta(tokenizer: Any, tmp_path: Path) -> None:
    """An earlier attempt that finishes late (a worker that lost its heartbeat) never overwrites the delta the
    workflow went on with."""
    import dataclasses

    store = CountingStore(tmp_path / "store")
    req = TrajectoryRequest()
    inp = req.generate_input("traj-3/run-1", 0, None, observation(0))
    first, retry = ActivityEnvironment(), ActivityEnvironment()
    retry.info = dataclasses.replace(retry.info, attempt=2)
    kept = await retry.run(decoder(tokenizer, store, "b").generate, inp)
    late = await first.run(decoder(tokenizer, store, "a").generate, inp)
    assert kept.context_uri != late.context_uri and kept.context_uri.endswith("context-turn000-attempt2.json")
    assert (await save(store, req, kept.context_uri)).context == (await save(store, req, late.context_uri)).context
