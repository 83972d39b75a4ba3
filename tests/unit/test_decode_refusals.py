"""Honest refusals and budgets at the decode activity (the real activity, a real local store, no Temporal server):
a turn stays within the context budget (the task's `max_context_tokens` and the engine's positions), a prompt that
fills it generates nothing and says so (`context_full`), and `llm.describe` tells a frozen engine from one that
follows training, which is what a training run checks before it starts (`trajflow.workflows.preflight`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.testing import ActivityEnvironment
from transformers import AutoConfig, AutoTokenizer

from trajflow.activities.decode import DecodeActivities, context_room
from trajflow.contracts.config import OpenAIServerConfig
from trajflow.contracts.engines import CONTEXT_FULL, PolicyWeights
from trajflow.contracts.records import TurnContext
from trajflow.contracts.trajectory import SamplingParams, TrajectoryRequest
from trajflow.infra.store import LocalStore
from trajflow.rl.chat import append_user
from trajflow.rl.engines.hf import HFEngine
from trajflow.rl.engines.openai import OpenAIEngine
from trajflow.rl.engines.scripted import ScriptedEngine
from trajflow.workflows.preflight import frozen_refusal

REPLY = "one two three four five six seven eight nine ten eleven twelve"
OBSERVATION = "Guess a number between 1 and 10."


class NoWeights:
    """A weight source with nothing published: enough to make an engine one that follows training."""

    def latest(self, policy: str) -> PolicyWeights | None:
        return None

    def latest_version(self, policy: str) -> int:
        return 0


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model)


def prompt_tokens(tokenizer: Any, req: TrajectoryRequest) -> int:
    """The first turn's prompt length, as the decode activity builds it."""
    _, ids = append_user(TurnContext(model="scripted"), tokenizer, OBSERVATION, req.system_prompt)
    return len(ids)


def test_the_room_is_the_smaller_limit_less_the_prompt() -> None:
    assert context_room(100, None, None) is None
    assert context_room(100, 150, None) == 50
    assert context_room(100, None, 120) == 20
    assert context_room(100, 150, 120) == 20
    assert context_room(100, 100, 4096) == 0
    assert context_room(130, 120, None) == -10


@pytest.mark.parametrize(("budget_over_prompt", "positions_over_prompt", "tokens"), [(5, None, 5), (50, 3, 3)])
async def test_a_turn_is_cut_to_the_room_left(
    tokenizer: Any, tmp_path: Path, budget_over_prompt: int, positions_over_prompt: int | None, tokens: int
) -> None:
    req = TrajectoryRequest(sampling=SamplingParams(max_new_tokens=32))
    prompt = prompt_tokens(tokenizer, req)
    req = req.model_copy(update={"max_context_tokens": prompt + budget_over_prompt})
    engine = ScriptedEngine(tokenizer, REPLY)
    if positions_over_prompt is not None:
        engine.max_positions = prompt + positions_over_prompt
    decoder = DecodeActivities(engine, LocalStore(tmp_path), "p", "w")
    gen = await ActivityEnvironment().run(decoder.generate, req.generate_input("t/r", 0, None, OBSERVATION))
    assert (gen.prompt_tokens, gen.completion_tokens, gen.finish_reason) == (prompt, tokens, "length")


async def test_a_prompt_that_fills_the_budget_generates_nothing(tokenizer: Any, tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    decoder = DecodeActivities(ScriptedEngine(tokenizer, REPLY), store, "p", "w")
    env = ActivityEnvironment()
    req = TrajectoryRequest(sampling=SamplingParams(max_new_tokens=8))
    first = await env.run(decoder.generate, req.generate_input("t/r", 0, None, OBSERVATION))
    # the second turn's prompt is the first turn's context plus a new observation: over a budget the first turn fit
    budget = first.prompt_tokens + first.completion_tokens + 1
    req = req.model_copy(update={"max_context_tokens": budget})
    written = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    full = await env.run(decoder.generate, req.generate_input("t/r", 1, first.context_uri, OBSERVATION))
    assert full.finish_reason == CONTEXT_FULL
    assert (full.text, full.completion_tokens) == ("", 0)
    assert full.prompt_tokens > budget
    assert full.context_uri == first.context_uri, "the context is left as the last turn that fit wrote it"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == written, "nothing was stored"


async def test_describe_tells_a_frozen_engine_from_one_that_follows_training(tokenizer: Any, tmp_path: Path) -> None:
    store, env = LocalStore(tmp_path), ActivityEnvironment()
    following = await env.run(
        DecodeActivities(ScriptedEngine(tokenizer, "a", weights=NoWeights()), store, "p", "w1").describe
    )
    frozen = await env.run(DecodeActivities(ScriptedEngine(tokenizer, "a"), store, "games", "w2").describe)
    assert following.follows_training and frozen_refusal(following) is None
    assert not frozen.follows_training
    refusal = frozen_refusal(frozen)
    assert refusal is not None and "decode pool 'games'" in refusal and "'scripted'" in refusal and "w2" in refusal


def test_each_engine_says_whether_it_follows_training_and_its_positions(tiny_model: Path) -> None:
    positions = AutoConfig.from_pretrained(tiny_model).max_position_embeddings
    assert isinstance(positions, int) and positions > 0
    hf = HFEngine(tiny_model, weights=NoWeights())
    assert hf.follows_training and hf.max_positions == positions
    assert not HFEngine(tiny_model).follows_training  # the initial model only: it never loads a run's versions
    server = OpenAIServerConfig(base_url="http://127.0.0.1:9/v1", served_model="tiny", policy_version=4)
    remote = OpenAIEngine(server, tiny_model, transport=httpx.MockTransport(lambda r: httpx.Response(500)))
    assert not remote.follows_training and remote.version == 4
    assert remote.max_positions is None  # until start() reads the server's max_model_len
