"""`[reward_models.NAME]` in a run config: validation with messages that say what to fix, the spec carried from the
config into every trajectory request, and the judge's score parsing."""

from __future__ import annotations

import pytest

from trajflow.contracts.config import parse_run_config
from trajflow.contracts.reward_models import JudgeModelConfig, LocalModelConfig
from trajflow.contracts.trajectory import TrajectoryRequest
from trajflow.rewards.judge import normalise, parse_score

CONFIG = """
[reward_models.grader]
kind = "judge"
base_url = "http://10.0.0.5:8000/v1/"
model = "qwen"
api_key_env = "JUDGE_KEY"

[reward_models.rm]
kind = "local"
url = "http://127.0.0.1:8090"

[[tasks]]
name = "judged"
env_id = "game:GuessTheNumber-v0-easy"
reward_fn = "model:grader"

[[tasks]]
name = "local"
env_id = "game:GuessTheNumber-v0-easy"
reward_fn = "model:rm"

[[tasks]]
name = "rule"
"""


def test_each_task_carries_its_models_spec_into_its_requests() -> None:
    config = parse_run_config(CONFIG, "test")
    judged, local, rule = config.training_run().tasks
    assert (
        isinstance(judged.reward_model, JudgeModelConfig) and judged.reward_model.base_url == "http://10.0.0.5:8000/v1"
    )
    assert isinstance(local.reward_model, LocalModelConfig) and local.reward_model.url == "http://127.0.0.1:8090"
    assert rule.reward_model is None
    req = judged.request(7)
    assert req.reward_model == judged.reward_model
    # the payload holds the variable's name, never a key
    assert '"api_key_env":"JUDGE_KEY"' in req.model_dump_json()
    score = req.score_request(["a"], [0.0], True, False, {}, observations=["task", "after"])
    assert score.observations == ["task", "after"] and score.reward_model == req.reward_model
    plain = rule.request(7).score_request(["a"], [0.0], True, False, {}, observations=["task", "after"])
    assert plain.observations == [] and plain.reward_model is None  # rule rewards' payloads stay as they were


def test_an_empty_request_still_validates() -> None:
    assert TrajectoryRequest.model_validate({}).reward_model is None


def test_an_undeclared_model_names_the_declared_ones() -> None:
    with pytest.raises(ValueError, match=r"no \[reward_models.judge\] is declared \(declared: grader, rm\)"):
        parse_run_config(CONFIG.replace('"model:grader"', '"model:judge"'), "test")


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("{prompt} {answer}", "unknown placeholder(s) ['answer']"),
        ("Grade {prompt} {response", "not a valid template"),
        ("Grade {prompt} against {reference}", "never shows the judge the agent's reply"),
        ('Answer as {"score": N}: {response}', "unknown placeholder"),
    ],
)
def test_a_bad_template_is_refused(template: str, says: str) -> None:
    with pytest.raises(ValueError, match="template") as info:
        JudgeModelConfig(base_url="http://h/v1", model="m", template=template)
    assert says in str(info.value)


def test_other_judge_fields_are_checked() -> None:
    with pytest.raises(ValueError, match="must be above min_score"):
        JudgeModelConfig(base_url="http://h/v1", model="m", min_score=5, max_score=5)
    with pytest.raises(ValueError, match="api_key_env"):
        JudgeModelConfig(base_url="http://h/v1", model="m", api_key_env="sk-abc123")  # a key, not a variable name
    with pytest.raises(ValueError, match="http:// or https://"):
        LocalModelConfig(url="127.0.0.1:8090")
    with pytest.raises(ValueError, match="timeout_s"):
        LocalModelConfig(url="http://h", timeout_s=120)


@pytest.mark.parametrize(
    ("reply", "fmt", "raw"),
    [
        ("Good.\nScore: 7", "score_line", 7.0),
        ("score = 3 at first, but on reflection **Score:** 9.5", "score_line", 9.5),
        ("SCORE: 10/10", "score_line", 10.0),
        ("I'd say 2, no, 6", "last_number", 6.0),
    ],
)
def test_scores_are_read_from_the_reply(reply: str, fmt: str, raw: float) -> None:
    spec = JudgeModelConfig(base_url="http://h/v1", model="m", score_format=fmt)  # type: ignore[arg-type]
    assert parse_score(reply, spec) == raw
    assert normalise(raw, spec) == raw / 10


def test_an_unreadable_or_out_of_range_score_is_an_error() -> None:
    spec = JudgeModelConfig(base_url="http://h/v1", model="m", min_score=1, max_score=5)
    with pytest.raises(ValueError, match="has no"):
        parse_score("No score given, sorry.", spec)
    with pytest.raises(ValueError, match="outside its range"):
        parse_score("Score: 0", spec)
