"""A dataset task's own verifier (`env_kwargs = { verifier = "MODULE:FUNCTION" }`): checked at submission without
importing it, packed with the dataset (with its requirements), called by the dataset env on every reply, and its
verdict scored by the reward service's `verifier` reward. The shipped example's verifier (examples/arithmetic)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trajflow.contracts.scoring import ScoreRequest
from trajflow.contracts.trajectory import JsonScalar
from trajflow.envs.dataset import DatasetEnv, DatasetError
from trajflow.rewards import registry
from trajflow.sandbox.user.datasets import check_dataset
from trajflow.sandbox.user.source import EnvSourceError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "arithmetic"
ROWS = [{"prompt": "2+2?", "answer": 4, "metadata": {"unit": "apples"}}, {"prompt": "3+3?", "answer": 6}]


@pytest.fixture
def task_dir(tmp_path: Path) -> Iterator[Path]:
    """A dataset file with verifier modules beside it, importable as the sandbox's image makes them."""
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    (tmp_path / "two.py").write_text("def check(response, reference):\n    return response.strip() == reference\n")
    (tmp_path / "three.py").write_text(
        "def check(response, reference, metadata):\n    return 0.5 if metadata.get('unit', '?') in response else 0.0\n"
    )
    (tmp_path / "broken.py").write_text("def check(response, reference):\n    return float('nan')\n")
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in ("two", "three", "broken"):
        sys.modules.pop(name, None)


def test_the_env_gives_the_verifiers_verdict_and_the_reward_service_scores_it(task_dir: Path) -> None:
    env = DatasetEnv(task_dir / "d.jsonl", verifier="two:check")
    env.reset(seed=0)
    obs, reward, done, _, info = env.step(" 4 ")
    assert (obs, reward, done, info["verified"], info["solved"]) == ("Answer recorded.", 1.0, True, 1.0, True)
    env.reset(seed=0)
    assert env.step("\\boxed{4}")[1] == 0.0  # the user's verifier decides, not the math checker
    req = ScoreRequest(
        reward_fn="verifier", env_id="data:d", actions=["x"], final_info={"verified": 0.25, "answer": "4"}
    )
    result = registry.score(req)
    assert result.reward == 0.25 and result.details["verified"] == 0.25


def test_a_three_argument_verifier_gets_the_rows_metadata(task_dir: Path) -> None:
    env = DatasetEnv(task_dir / "d.jsonl", verifier="three:check", attempts=2)
    env.reset(seed=0)
    assert env.step("4 apples")[1:3] == (0.0, False)  # 0.5 is not solved: another attempt
    assert env.step("4 apples")[1:3] == (0.5, True)  # the last attempt ends with its verdict
    env.reset(seed=1)  # a row without metadata: {}
    assert env.step("6")[1] == 0.0


def test_a_verifier_that_cannot_load_or_returns_garbage_is_an_env_error(task_dir: Path) -> None:
    with pytest.raises(DatasetError, match="cannot be loaded: ModuleNotFoundError"):
        DatasetEnv(task_dir / "d.jsonl", verifier="missing:check")
    with pytest.raises(DatasetError, match="cannot be loaded: AttributeError"):
        DatasetEnv(task_dir / "d.jsonl", verifier="two:nope")
    env = DatasetEnv(task_dir / "d.jsonl", verifier="broken:check")
    env.reset(seed=0)
    with pytest.raises(DatasetError, match="returned nan; a verifier returns a finite float or a bool"):
        env.step("4")


def test_the_verifier_reward_refuses_an_episode_without_a_verdict() -> None:
    infos: list[dict[str, JsonScalar]] = [{}, {"verified": "yes"}]
    for info in infos:
        with pytest.raises(registry.RewardInputError, match="final_info\\['verified'\\]"):
            registry.score(ScoreRequest(reward_fn="verifier", env_id="game:X", final_info=info))


def test_the_verifier_goes_into_the_package_with_its_requirements(task_dir: Path) -> None:
    (task_dir / "requirements.txt").write_text("sympy==1.14.0\n")
    pkg = task_dir / "checks"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "numeric.py").write_text("def close(response, reference, metadata=None):\n    return 1.0\n")
    data = check_dataset("data:d", task_dir / "d.jsonl", "checks.numeric:close")
    assert sorted(data.files()) == ["checks/__init__.py", "checks/numeric.py", "d.jsonl", "requirements.txt"]
    assert data.requirements == ("sympy==1.14.0",)
    assert sorted(check_dataset("data:d", task_dir / "d.jsonl", "two:check").files()) == [
        "d.jsonl", "requirements.txt", "two.py"
    ]  # fmt: skip
    assert list(check_dataset("data:d", task_dir / "d.jsonl").files()) == ["d.jsonl"]


@pytest.mark.parametrize(
    ("spec", "source", "says"),
    [
        ("two", None, "is not MODULE:FUNCTION"),
        (3, None, "is not MODULE:FUNCTION"),
        ("nothere:check", None, "no verifier module 'nothere'"),
        ("v:check", "def other(a, b): ...\n", "defines no function 'check' at its top level \\(it defines other\\)"),
        ("v:check", "def check(response): ...\n", "takes 1 positional argument"),
        ("v:check", "def check(a, b, c, d): ...\n", "requires a, b, c, d"),
        ("v:check", "async def check(a, b): ...\n", "is async"),
        ("v:check", "def check(a, b, *, strict): ...\n", "keyword-only arguments without defaults"),
        ("v:check", "def check(a, b:\n", "syntax error"),
    ],
)
def test_a_bad_verifier_is_refused_at_submission_saying_what_to_fix(
    task_dir: Path, spec: object, source: str | None, says: str
) -> None:
    if source is not None:
        (task_dir / "v.py").write_text(source)
    with pytest.raises(EnvSourceError, match=says):
        check_dataset("data:d", task_dir / "d.jsonl", spec)


def test_imported_or_assigned_verifiers_are_trusted(task_dir: Path) -> None:
    (task_dir / "v.py").write_text("from two import check as verify\nscore = verify\n")
    check_dataset("data:d", task_dir / "d.jsonl", "v:verify")
    check_dataset("data:d", task_dir / "d.jsonl", "v:score")


def test_the_shipped_verifier_judges_chain_sum_replies() -> None:
    data = check_dataset("data:chain_sum", EXAMPLE / "chain_sum.jsonl", "sum_check:check")
    assert sorted(data.files()) == ["chain_sum.jsonl", "sum_check.py"]
    sys.path.insert(0, str(EXAMPLE))
    try:
        env = DatasetEnv(EXAMPLE / "chain_sum.jsonl", verifier="sum_check:check")
        prompt, _ = env.reset(seed=2)
        assert "5 - 9" in prompt
        verdicts = [env.step(reply)[1] for reply in ("\\boxed{-4}", "\\boxed{-4.0}", "\\boxed{4}", "-4")]
    finally:
        sys.path.remove(str(EXAMPLE))
        sys.modules.pop("sum_check", None)
    assert verdicts == [1.0, 1.0, 0.0, -0.1]
