"""Bad input, the pure parts (issue 5): validation messages, the size caps, NaN handling, the observation cap, the
reward client's verdict on garbage, and the CLI's exit code 2. The Temporal side is tests/integration/test_bad_input.py
and test_bad_input_stack.py.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from typer.testing import CliRunner

from trajflow.contracts import names
from trajflow.contracts.errors import MAX_MESSAGE_CHARS, explain_invalid
from trajflow.contracts.limits import MAX_OBSERVATION_CHARS, MAX_SYSTEM_PROMPT_CHARS
from trajflow.contracts.scoring import ScoreRequest, ScoreResult
from trajflow.contracts.tasks import TaskConfig
from trajflow.contracts.training import TrainingStart, TrainStepResult
from trajflow.contracts.trajectory import EnvStepResult, TrajectoryReport, TrajectoryRequest, TrajectoryStatus
from trajflow.envs.formatting import cap_observation
from trajflow.rewards.client import MAX_ANSWER_BYTES, RewardClient, RewardServiceBadAnswer

REPO = Path(__file__).resolve().parents[2]


def message(model, data) -> str:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return explain_invalid(model, info.value, "fix the workflow input")


def test_the_message_names_each_bad_field_what_it_expects_and_what_to_fix() -> None:
    text = message(TrajectoryRequest, {"seed": "abc", "sampling": {"top_p": 2, "bogus": 1}})
    assert text.startswith("TrajectoryRequest: ") and text.endswith(" — fix the workflow input")
    assert "seed: Input should be a valid integer, unable to parse string as an integer (got 'abc')" in text
    assert "sampling.top_p: Input should be less than or equal to 1 (got 2)" in text
    assert "sampling.bogus: not a field (known fields: max_new_tokens, seed, temperature, top_p)" in text


def test_the_message_of_a_huge_input_is_bounded_and_never_echoes_it() -> None:
    text = message(TrajectoryRequest, {"system_prompt": "x" * 5_000_000, **{f"f{i}": i for i in range(500)}})
    assert len(text) <= MAX_MESSAGE_CHARS and "xxxxxxxxxx" not in text
    assert f"at most {MAX_SYSTEM_PROMPT_CHARS} characters (got a str of 5000000 characters)" in text


def test_json_that_is_not_an_object_or_not_json_says_so() -> None:
    with pytest.raises(ValidationError) as info:
        TrainingStart.model_validate_json(b'{"run": ')
    assert "Invalid JSON" in explain_invalid(TrainingStart, info.value, "fix it")
    assert "got None (use {} for every default)" in message(TrainingStart, None)


@pytest.mark.parametrize(
    "env_id",
    [
        "game:GuessTheNumber-v0-easy",
        "rg:basic_arithmetic",
        "shell:roman-numerals",
        "synthetic:gaussian-delay",
        "agent-cmd:bin/agent",
    ],
)
def test_env_ids_of_every_kind_are_accepted(env_id: str) -> None:
    assert TrajectoryRequest(env_id=env_id).env_id == env_id == TaskConfig(env_id=env_id).env_id


@pytest.mark.parametrize("env_id", ["GuessTheNumber", "", "game:", ":x", "game: spaced", "Game:X", "x" * 300])
def test_env_ids_of_the_wrong_form_are_refused_with_examples(env_id: str) -> None:
    text = message(TrajectoryRequest, {"env_id": env_id})
    assert text.startswith("TrajectoryRequest: env_id: ")
    assert "game:GuessTheNumber-v0-easy" in text or "at most 200 characters" in text or "at least 3" in text


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"reward_fn": "model:rm"}, "TrajectoryRequest: reward_fn 'model:rm' needs the model's spec in reward_model"),
        (
            {"reward_model": {"kind": "local", "url": "http://127.0.0.1:8090"}},
            "TrajectoryRequest: reward_model is set but reward_fn 'env_outcome' is not model:NAME",
        ),
    ],
)
def test_a_reward_model_and_its_spec_go_together(fields: dict, expected: str) -> None:
    assert expected in message(TrajectoryRequest, fields)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"env_kwargs": {f"k{i}": i for i in range(65)}}, "env_kwargs: Dictionary should have at most 64 items"),
        (
            {"env_kwargs": {"k": "v" * 5000}},
            "env_kwargs.k: a string of 5000 characters; an env kwarg may hold at most 4096",
        ),
        ({"env_kwargs": {"k": [1, 2]}}, "env_kwargs.k: an env kwarg is a string, number, boolean or null, not list"),
        ({"reward_fn": "f" * 101}, "reward_fn: String should have at most 100 characters"),
        ({"run_id": "r" * 1001}, "run_id: String should have at most 1000 characters"),
        ({"pools": {"decode": "gpu pool"}}, "pools.decode: String should match pattern"),
    ],
)
def test_user_facing_fields_are_capped(fields: dict, expected: str) -> None:
    assert expected in message(TrajectoryRequest, fields)


def test_a_trajectory_request_at_its_caps_fits_in_one_payload() -> None:
    req = TrajectoryRequest(
        system_prompt="p" * MAX_SYSTEM_PROMPT_CHARS,
        env_kwargs={f"k{i:03d}" + "k" * 96: "v" * 4096 for i in range(64)},
        run_id="r" * 1000,
        policy="p" * 1000,
        group="g" * 1000,
        report_to="t" * 1000,
    )
    assert len(req.model_dump_json()) < 400_000  # far below the 2 MB one payload may hold


def test_a_nan_reward_is_refused_where_it_would_be_trained_on() -> None:
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValidationError, match="finite number"):
            ScoreResult(reward=bad, reward_fn="x")
        with pytest.raises(ValidationError, match="finite number"):
            TrajectoryReport(
                workflow_id="w",
                trajectory_uri=None,
                group="",
                policy_version=0,
                reward=bad,
                status=TrajectoryStatus.COMPLETED,
            )


def test_nan_in_an_activity_result_survives_the_converter_instead_of_wedging_the_workflow() -> None:
    """Before, pydantic wrote NaN as `null`, which then failed to decode as a float: a workflow task failing forever."""
    conv = pydantic_data_converter.payload_converter
    step = TrainStepResult(version=1, weights_uri=None, metrics={"loss": math.nan, "grad_norm": math.inf})
    back = conv.from_payload(conv.to_payload(step), TrainStepResult)
    assert math.isnan(back.metrics["loss"]) and back.metrics["grad_norm"] == math.inf
    env = EnvStepResult(observation="o", reward=math.nan, terminated=False, truncated=False)
    assert math.isnan(conv.from_payload(conv.to_payload(env), EnvStepResult).reward)


def test_the_observation_cap_keeps_head_and_tail_and_says_how_much_was_cut() -> None:
    text = "h" * 100 + "m" * 10_000_000 + "t" * 100
    cut = cap_observation(text, MAX_OBSERVATION_CHARS)
    assert len(cut) < MAX_OBSERVATION_CHARS + 100
    assert cut.startswith("h" * 100) and cut.endswith("t" * 100)
    assert f"[... trajflow cut {len(text) - MAX_OBSERVATION_CHARS} characters of this observation ...]" in cut
    assert cap_observation("short", MAX_OBSERVATION_CHARS) == "short"


def test_the_env_worker_cuts_observations_and_refuses_non_finite_rewards() -> None:
    from trajflow.activities.env import _step_result

    big = _step_result({"observation": "y" * 3_000_000, "reward": 0.0, "terminated": False, "truncated": False})
    assert len(big.observation) < MAX_OBSERVATION_CHARS + 100 and "trajflow cut" in big.observation
    with pytest.raises(ApplicationError) as info:
        _step_result({"observation": "o", "reward": "nan", "terminated": True, "truncated": False})
    assert info.value.type == names.ERR_ENV and info.value.non_retryable and "non-finite reward" in str(info.value)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"Internal error, sorry", "Invalid JSON"),
        (b'{"reward": "high", "reward_fn": "x"}', "reward: Input should be a valid number"),
        (b'{"reward": NaN, "reward_fn": "x"}', "reward: Input should be a finite number"),
        (b'{"reward": 1e999, "reward_fn": "x"}', "reward: Input should be a finite number"),
        (b"[1.0]", "Input should be an object"),
        (
            b'{"reward": 1, "reward_fn": "x", "details": {"a": "' + b"z" * MAX_ANSWER_BYTES + b'"}}',
            "bytes, more than the 65,536",
        ),
    ],
)
def test_the_reward_client_calls_garbage_a_bad_answer_naming_the_service(body: bytes, expected: str) -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))

    async def score() -> None:
        async with RewardClient("http://reward.test:8080", transport=transport) as client:
            await client.score(ScoreRequest(env_id="game:X"))

    with pytest.raises(RewardServiceBadAnswer) as info:
        asyncio.run(score())
    assert "reward service at http://reward.test:8080 answered 200" in str(info.value)
    assert expected in str(info.value) and not info.value.retryable


def cli(*args: str):
    from trajflow.cli import app

    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--request", '{"seed": 1,,}'], "--request is not valid JSON"),
        (["--request", '{"seed": "abc"}'], "seed: Input should be a valid integer"),
        (
            ["--request", '{"bogus": 1}'],
            "bogus: not a field (known fields: branch_index, branch_of, branch_record, branch_turn, env_id",
        ),
        (["--request", "[1]"], "--request must be a JSON object"),
        (["--env", "NoSuchGame"], "'NoSuchGame' is not an env id"),
        (["--max-turns", "0"], "max_turns: Input should be greater than or equal to 1"),
        (["--task", "nope"], "no task 'nope' in the config"),
    ],
)
def test_rollout_with_bad_input_exits_2_before_touching_the_stack(args: list[str], expected: str) -> None:
    r = cli("rollout", "-c", str(REPO / "trajflow" / "configs" / "tiny.toml"), *args)
    assert r.exit_code == 2, r.output
    assert expected in r.output


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ("[train\nsteps = 2\n", "not valid TOML"),
        ("[train]\nsteps = 'many'\n", "train.steps\n  Input should be a valid integer"),
        ("[train]\nbatch_size = 6\ngroup_size = 4\n", "batch_size (6) must be a multiple of group_size (4)"),
        ("[[tasks]]\nenv_id = 'NoSuchGame'\n", "'NoSuchGame' is not an env id"),
        ("[[tasks]]\nname = 'a'\npools = { env = 'gpu' }\n", "[pools].env declares only ['default']"),
        ("[train]\nbogus = 1\n", "Extra inputs are not permitted"),
    ],
)
def test_train_with_an_invalid_config_exits_2_naming_the_field(tmp_path: Path, toml: str, expected: str) -> None:
    path = tmp_path / "run.toml"
    path.write_text(toml)
    r = cli("train", str(path), "--no-eval")
    assert r.exit_code == 2, r.output
    assert expected in r.output and str(path) in r.output


def test_the_stubs_refuse_an_activity_input_over_the_payload_limit_without_retrying() -> None:
    from trajflow.contracts.limits import MAX_PAYLOAD_BYTES
    from trajflow.contracts.trajectory import EnvResetInput
    from trajflow.workflows import stubs

    small = EnvResetInput(trajectory_id="t", env_id="game:X", seed=0, replay_actions=["a" * 1000] * 10)
    assert stubs._fits(names.ENV_RESET, small) is small
    big = EnvResetInput(trajectory_id="t", env_id="game:X", seed=0, replay_actions=["\u2603" * 10_000] * 100)
    with pytest.raises(ApplicationError) as info:  # 1 M characters, 3 MB of UTF-8: counted in bytes
        stubs._fits(names.ENV_RESET, big)
    assert info.value.type == names.ERR_PAYLOADS_TOO_LARGE and info.value.non_retryable
    assert info.value.message.startswith("env.reset: its input would be 3,00")
    assert f"{MAX_PAYLOAD_BYTES:,} bytes" in info.value.message
    assert names.ERR_PAYLOADS_TOO_LARGE in stubs.ENV_FATAL and names.ERR_PAYLOADS_TOO_LARGE in stubs.REWARD_FATAL


def test_an_activity_failure_is_described_once_by_its_type() -> None:
    from temporalio.exceptions import ApplicationError

    from trajflow.workflows import stubs

    assert (
        stubs.describe(ApplicationError("EnvError: step failed: boom", type="EnvError"))
        == "EnvError: step failed: boom"
    )
    assert stubs.describe(ApplicationError("step failed: boom", type="EnvError")) == "EnvError: step failed: boom"
    assert stubs.describe(ValueError("bad")) == "ValueError: bad"
