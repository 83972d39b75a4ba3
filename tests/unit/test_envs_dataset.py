"""Dataset tasks (`data:NAME`): the dataset env's rows, splits and seeds, its attempts, the shared answer
checkers, the verifier rewards, and the checks a dataset file gets at submission."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trajflow.contracts.config import parse_run_config
from trajflow.contracts.scoring import ScoreRequest
from trajflow.contracts.training import EvalConfig
from trajflow.envs import verify
from trajflow.envs.dataset import HELD_OUT_FROM, DatasetEnv, DatasetError, read_rows, splits
from trajflow.rewards import registry
from trajflow.sandbox.user.datasets import check_dataset
from trajflow.sandbox.user.source import EnvSourceError

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "examples" / "arithmetic" / "chain_sum.jsonl"


def jsonl(tmp_path: Path, rows: list[dict], name: str = "d.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def numbered(n: int, **extra: object) -> list[dict]:
    return [{"prompt": f"q{i}", "answer": str(i), **extra} for i in range(n)]


def test_without_a_split_column_every_tenth_row_is_held_out(tmp_path: Path) -> None:
    train, test = splits(read_rows(jsonl(tmp_path, numbered(25))))
    assert [r["prompt"] for r in test] == ["q9", "q19"] and len(train) == 23


def test_seeds_index_train_rows_and_held_out_seeds_index_test_rows(tmp_path: Path) -> None:
    rows = [{"prompt": "t0", "answer": 0, "split": "train"}, {"prompt": "t1", "answer": 1, "split": "train"},
            {"prompt": "h0", "answer": 5, "split": "test"}]  # fmt: skip
    env = DatasetEnv(jsonl(tmp_path, rows))
    assert [env.reset(seed=s)[0] for s in (0, 1, 2, 3)] == ["t0", "t1", "t0", "t1"]
    prompt, info = env.reset(seed=HELD_OUT_FROM + 7)
    assert prompt == "h0" and info == {"split": "test", "row": 0}
    assert HELD_OUT_FROM == EvalConfig().first_seed  # the eval's held-out seeds are the test rows


def test_a_single_turn_reply_ends_the_episode_with_the_reference_for_the_verifier(tmp_path: Path) -> None:
    env = DatasetEnv(jsonl(tmp_path, [{"prompt": "2+2?", "answer": 4, "metadata": {"level": 1}}]))
    assert env.reset(seed=0) == ("2+2?", {"split": "train", "row": 0, "metadata.level": 1})
    final = {"answer": "4", "tries": 1, "verified": 0.0, "solved": False}
    assert env.step("\\boxed{5}") == ("Answer recorded.", 0.0, True, False, final)
    env.reset(seed=0)
    assert env.step("\\boxed{4}") == ("Answer recorded.", 1.0, True, False, final | {"verified": 1.0, "solved": True})


def test_attempts_give_feedback_and_a_second_try(tmp_path: Path) -> None:
    env = DatasetEnv(jsonl(tmp_path, [{"prompt": "half?", "answer": "1/2"}]), attempts=2)
    env.reset(seed=0)
    assert env.step("\\boxed{1/3}") == ("That is not correct. 1 attempt(s) left.", 0.0, False, False, {"tries": 1})
    obs, reward, done, _, info = env.step("It is \\boxed{0.5}")
    assert (obs, reward, done, info["solved"], info["answer"], info["verified"]) == (
        "Correct.",
        1.0,
        True,
        True,
        "1/2",
        1.0,
    )
    env.reset(seed=0)
    env.step("1")
    assert env.step("2")[1:3] == (0.0, True)


@pytest.mark.parametrize(
    ("reply", "extracted"),
    [
        ("so \\boxed{\\frac{1}{2}} ok", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("work\n\n  42  \n", "42"),
        ("", ""),
    ],
)
def test_extract_answer(reply: str, extracted: str) -> None:
    assert verify.extract_answer(reply) == extracted


@pytest.mark.parametrize(
    ("kind", "reply", "reference", "right"),
    [
        ("math", "\\boxed{0.5}", "1/2", True),
        ("math", "\\boxed{\\frac{1}{2}}", "0.5", True),
        ("math", "\\boxed{-4}", "-4", True),
        ("math", "\\boxed{4}", "-4", False),
        ("exact", "\\boxed{ Paris  France }", "paris france", True),
        ("exact", "\\boxed{Lyon}", "Paris", False),
        ("regex", "\\boxed{x = 12}", r"x\s*=\s*12", True),
        ("regex", "\\boxed{x = 12}", r"[", False),  # a bad pattern is a miss, not a crash
    ],
)
def test_checkers(kind: str, reply: str, reference: str, right: bool) -> None:
    assert verify.check(kind, reply, reference) is right


def test_verifier_rewards_score_the_last_reply_against_the_reference() -> None:
    actions = ["\\boxed{3}", "\\boxed{6/2}"]
    req = ScoreRequest(reward_fn="math_verify", env_id="data:x", actions=actions, final_info={"answer": "3"})
    result = registry.score(req)
    assert result.reward == 1.0 and result.details["answer"] == "6/2" and result.details["correct"] is True
    wrong = registry.score(req.model_copy(update={"reward_fn": "exact_match"}))
    assert wrong.reward == 0.0
    with pytest.raises(registry.RewardInputError, match="final_info\\['answer'\\]"):
        registry.score(ScoreRequest(reward_fn="regex_match", env_id="game:X", actions=["a"]))


def test_the_shipped_dataset_passes_the_submission_check() -> None:
    data = check_dataset("data:chain_sum", SHIPPED)
    assert (data.train_rows, data.test_rows) == (400, 100)
    assert list(data.files()) == ["chain_sum.jsonl"]


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        ([{"prompt": "q"}], "row 1 has no answer"),
        ([{"answer": "1"}], "row 1 has no prompt"),
        ([{"prompt": "q", "answer": "1", "split": "dev"}], "split is 'dev'"),
        ([{"prompt": "q", "answer": "1", "split": "test"}], "no train rows"),
    ],
)
def test_a_bad_dataset_is_refused_at_submission(tmp_path: Path, rows: list[dict], says: str) -> None:
    with pytest.raises(EnvSourceError, match=says):
        check_dataset("data:mine", jsonl(tmp_path, rows))


def test_bad_files_and_names_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"prompt": "q", "answer": 1}\nnot json\n')
    with pytest.raises(EnvSourceError, match="x.jsonl:2: not JSON"):
        check_dataset("data:mine", bad)
    with pytest.raises(EnvSourceError, match="not a .jsonl or .parquet file"):
        check_dataset("data:mine", tmp_path / "x.csv")
    with pytest.raises(EnvSourceError, match="data:NAME"):
        check_dataset("data:Mine!", bad)


def test_parquet_rows_read_like_jsonl(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(numbered(12)), path)
    assert read_rows(path) == numbered(12)
    with pytest.raises(DatasetError, match="no rows"):
        read_rows(jsonl(tmp_path, [], "empty.jsonl"))


def test_a_held_out_split_that_the_eval_would_miss_is_refused() -> None:
    text = '[[tasks]]\nname = "d"\nenv_id = "data:d"\nenv_path = "d.jsonl"\n[train.eval]\nfirst_seed = 5000000\n'
    with pytest.raises(ValueError, match="set held_out_from = 5000000"):
        parse_run_config(text, "t.toml")
    fixed = text.replace('env_path = "d.jsonl"', 'env_path = "d.jsonl"\nenv_kwargs = { held_out_from = 5000000 }')
    parse_run_config(fixed, "t.toml")
