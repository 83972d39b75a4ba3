"""Branching's pure parts and its activity, without Temporal's server: the cut of a token context at the end of
turn k-1 (the context the turns before it built, exactly), the branch request's validation and its merge with the
parent's, and `trajectory.branch` on a real local store: the prefix, the cut context written where the branch's
decode of turn k reads it (and extends it), and each refusal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from transformers import AutoTokenizer

from trajflow.activities.contexts import ContextStore
from trajflow.activities.decode import DecodeActivities
from trajflow.activities.reward import RewardActivities
from trajflow.contracts import names
from trajflow.contracts.branches import BranchInput, BranchRefused, branch_request, cut_context
from trajflow.contracts.records import TrajectoryRecord, TurnContext
from trajflow.contracts.trajectory import (
    SamplingParams,
    StagePools,
    TrajectoryRequest,
    TrajectoryStatus,
    TurnSummary,
)
from trajflow.infra.layout import trajectory_record_key
from trajflow.infra.store import LocalStore
from trajflow.rl.chat import append_completion, append_user
from trajflow.rl.engines.scripted import ScriptedEngine
from trajflow.rl.models import build_tiny_model

TURNS = 3


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("branch") / "tiny"))


def obs(turn: int) -> str:
    return f"observation before turn {turn + 1}"


def action(turn: int) -> str:
    return f"I guess \\boxed{{{turn + 3}}}"


def contexts(tokenizer: Any) -> list[TurnContext]:
    """The context after 0, 1, ... TURNS turns, each built turn by turn as the decode activity builds it."""
    ctx, out = TurnContext(model="scripted"), [TurnContext(model="scripted")]
    for turn in range(TURNS):
        ctx, _ = append_user(ctx, tokenizer, obs(turn), "system")
        ids = tokenizer.encode(action(turn), add_special_tokens=False) + [tokenizer.eos_token_id]
        ctx = append_completion(ctx, ids, [-0.5] * len(ids), action(turn), turn + 7)
        out.append(ctx)
    return out


def record(tokenizer: Any, env_id: str = "game:GuessTheNumber-v0-easy", max_turns: int = 5) -> TrajectoryRecord:
    turns = [
        TurnSummary(
            action=action(t),
            observation=obs(t + 1),
            env_reward=0.0,
            policy_version=t + 7,
            completion_tokens=5,
            decode_pool="p",
        )  # fmt: skip
        for t in range(TURNS)
    ]
    req = TrajectoryRequest(env_id=env_id, seed=11, max_turns=max_turns, sampling=SamplingParams(temperature=0.7))
    return TrajectoryRecord(
        workflow_id="parent", request=req, status=TrajectoryStatus.COMPLETED, reward=0.0, first_observation=obs(0),
        turns=turns, context=contexts(tokenizer)[-1], env_recoveries=0,
    )  # fmt: skip


def test_the_cut_at_turn_k_minus_1_is_the_context_those_turns_built(tokenizer: Any) -> None:
    built = contexts(tokenizer)
    assert cut_context(built[-1], 0) is None
    for n in range(1, TURNS + 1):
        assert cut_context(built[-1], n) == built[n], n
    # the cut ends with turn n's completion: the next observation can be appended to it, as decode does
    again, _ = append_user(cut_context(built[-1], 1), tokenizer, obs(1), "system")  # type: ignore[arg-type]
    assert again.token_ids == built[2].token_ids[: len(again.token_ids)]
    with pytest.raises(BranchRefused, match="fewer than 4"):
        cut_context(built[-1], 4)


def test_a_branch_request_is_validated() -> None:
    assert TrajectoryRequest(branch_of="p", branch_turn=1).branch_turn == 1
    with pytest.raises(ValidationError, match="branch_turn must be"):
        TrajectoryRequest(branch_of="p")
    with pytest.raises(ValidationError, match="need branch_of"):
        TrajectoryRequest(branch_turn=2)
    with pytest.raises(ValidationError, match="need branch_of"):
        TrajectoryRequest(branch_index=3)
    with pytest.raises(ValidationError):
        TrajectoryRequest(branch_of="p", branch_turn=201)
    assert TrajectoryRequest.model_validate({}).branch_of == ""  # old inputs stay valid


def test_a_branch_takes_the_episode_from_its_parent_and_the_sample_from_itself() -> None:
    parent = TrajectoryRequest(
        env_id="game:GuessTheNumber-v0", seed=4, max_turns=6, system_prompt="p", task="guess", run_id="run-a",
        policy="run-a", group="g", sampling=SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=9, seed=5),
    )  # fmt: skip
    pools = StagePools(decode="d", env="e", reward="r")
    branches = [
        branch_request(TrajectoryRequest(branch_of="par", branch_turn=2, branch_index=i, pools=pools), parent)
        for i in range(4)
    ]
    b = branches[0]
    assert (b.env_id, b.seed, b.max_turns, b.system_prompt, b.task) == ("game:GuessTheNumber-v0", 4, 6, "p", "guess")
    assert (b.sampling.temperature, b.sampling.top_p, b.sampling.max_new_tokens) == (0.7, 0.9, 9)
    assert (b.run_id, b.policy, b.group, b.pools) == ("", "", "", pools)
    assert (b.branch_of, b.branch_turn) == ("par", 2)
    seeds = [x.sampling.seed for x in branches]
    assert len(set(seeds)) == 4 and parent.sampling.seed not in seeds  # m branches sample differently
    same = branch_request(TrajectoryRequest(branch_of="par", branch_turn=2, branch_index=0, pools=pools), parent)
    assert same.sampling.seed == seeds[0]  # reproducible
    own = TrajectoryRequest(branch_of="par", branch_turn=2, sampling=SamplingParams(seed=99))
    assert branch_request(own, parent).sampling.seed == 99


async def branch(store: LocalStore, parent: str, turn: int, uri: str = ""):
    acts = RewardActivities(None, store)  # type: ignore[arg-type]  # branching needs no reward service
    inp = BranchInput(parent=parent, record_uri=uri, turn=turn, trajectory_id="child/run-1")
    return await ActivityEnvironment().run(acts.branch, inp)


async def test_the_branch_activity_writes_the_cut_context_that_turn_k_extends(tokenizer: Any, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    rec = record(tokenizer)
    uri = store.put_json(trajectory_record_key("parent", "run-0"), rec)
    prefix = await branch(store, "parent", 3)
    assert prefix.record_uri == uri and prefix.request == rec.request
    assert prefix.actions == [action(0), action(1)] and prefix.turns == rec.turns[:2]
    assert prefix.first_observation == obs(0) and prefix.observation == obs(2)
    assert prefix.context_uri is not None
    assert ContextStore(store, 0).load(prefix.context_uri) == contexts(tokenizer)[2]
    # the branch's turn k (0-based 2) decodes on top of it, as the parent's turn k did
    decoder = DecodeActivities(ScriptedEngine(tokenizer, action(2)), store, "p", "w")
    gen = await ActivityEnvironment().run(
        decoder.generate, rec.request.generate_input("child/run-1", 2, prefix.context_uri, obs(2))
    )
    grown = ContextStore(store, 0).load(gen.context_uri)
    assert grown.token_ids[: len(contexts(tokenizer)[3].token_ids)] == contexts(tokenizer)[3].token_ids
    assert grown.turn_versions[:2] == [7, 8] and len(grown.turn_spans) == 3
    first = await branch(store, "parent", 1, uri)  # k = 1: nothing reused
    assert first.actions == [] and first.context_uri is None and first.observation == obs(0)


@pytest.mark.parametrize(
    ("turn", "setup", "why"),
    [
        (5, "", "recorded 3 turns: branching at turn 5 needs 4"),
        (6, "", "turn 6 is out of range"),
        (2, "agent", "its record predates the answers kept whole"),
        (2, "missing", "no trajectory record"),
        (2, "twice", "2 runs' records"),
    ],
)
async def test_the_branch_activity_refuses_clearly(
    tokenizer: Any, tmp_path: Path, turn: int, setup: str, why: str
) -> None:
    store = LocalStore(tmp_path / "store")
    rec = record(tokenizer, env_id="agent:mod:fn" if setup == "agent" else "game:GuessTheNumber-v0-easy")
    if setup != "missing":
        store.put_json(trajectory_record_key("parent", "run-0"), rec)
    if setup == "twice":
        store.put_json(trajectory_record_key("parent", "run-1"), rec)
    with pytest.raises(ApplicationError, match=why) as err:
        await branch(store, "parent", turn)
    assert err.value.type == names.ERR_BAD_REQUEST and err.value.non_retryable
