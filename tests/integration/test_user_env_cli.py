"""A user env as a researcher brings one: `trajflow rollout` and `trajflow train` on the example's config
(`examples/factoring`) against the stack `trajflow up` started, and env definitions that cannot work refused at
submission with what to fix, before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT, submitted_offline

pytestmark = pytest.mark.integration

EXAMPLE = ROOT / "examples" / "factoring"


def training_config(tmp_path: Path) -> Path:
    """The example's config with the stack's tiny model and a two-step [train]: the same task, env and reward."""
    text = (EXAMPLE / "config.toml").read_text().split("\n[demo]\n")[0]
    text = text.replace('name_or_path = "smollm2"', 'name_or_path = "tiny"')
    text = text.replace('env_path = "."', f'env_path = "{EXAMPLE}"')
    assert 'env_id = "py:factor_env:FactorEnv"' in text and str(EXAMPLE) in text
    path = tmp_path / "factoring.toml"
    path.write_text(
        text + "\n[train]\nsteps = 2\nbatch_size = 8\ngroup_size = 4\nalpha = 1\n"
        "trainer = { lr = 1e-4, micro_batch = 8 }\neval = { episodes = 4 }\n"
    )
    return path


def test_rollout_of_the_example_config(cli_stack) -> None:
    proc = cli_stack.trajflow("rollout", "-c", str(EXAMPLE / "config.toml"), "--seed", "3", "--json", timeout=900)
    out = json.loads(proc.stdout)
    assert out["status"] == "completed" and 1 <= out["turns"] <= 3, out
    assert "packaged" in proc.stderr and "env-packages/" in proc.stderr


def test_training_on_the_example_env(cli_stack, tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    config = training_config(tmp_path)
    cli_stack.trajflow("train", str(config), "--run-id", "factoring-run", "--json-summary", str(out), timeout=900)
    summary = json.loads(out.read_text())
    assert summary["steps"] == 2 and summary["trajectories_trained"] == 16
    assert summary["eval_after"]["episodes"] == 4 and summary["eval_after"]["version"] == 2
    recorded = json.loads((cli_stack.state_dir / "runs" / "factoring-run" / "config.json").read_text())
    assert recorded["tasks"][0]["env_package"].endswith(".tar")  # the run records which package it trained on


def test_training_on_the_shipped_dataset(cli_stack, tmp_path: Path) -> None:
    """examples/arithmetic's config, both its tasks (single-turn and two attempts), with the stack's tiny model
    and two steps; the held-out eval runs on the dataset's test rows."""
    example = ROOT / "examples" / "arithmetic"
    text = (example / "config.toml").read_text().split("\n[demo]\n")[0]
    text = text.replace('name_or_path = "smollm2"', 'name_or_path = "tiny"').replace(
        '"chain_sum.jsonl"', f'"{example / "chain_sum.jsonl"}"'
    )
    config = tmp_path / "arithmetic.toml"
    train = (
        "\n[train]\nsteps = 2\nbatch_size = 8\ngroup_size = 4\ntrainer = { micro_batch = 8 }\neval = { episodes = 4 }\n"
    )
    config.write_text(text + train)
    out = tmp_path / "summary.json"
    proc = cli_stack.trajflow("train", str(config), "--run-id", "arith-run", "--json-summary", str(out), timeout=900)
    summary = json.loads(out.read_text())
    assert summary["steps"] == 2 and summary["trajectories_trained"] == 16
    assert "(400 train, 100 test rows)" in proc.stderr
    per_seed = summary["eval_after"]["per_episode"]
    assert len(per_seed) >= 4 and all(row["seed"] >= 1_000_000 for row in per_seed)  # held-out seeds: test rows


def bad_env(tmp_path: Path, source: str, requirements: str = "", env_id: str = "py:my_env:MyEnv") -> Path:
    env = tmp_path / "env"
    env.mkdir()
    (env / "my_env.py").write_text(source)
    (env / "requirements.txt").write_text(requirements)
    config = tmp_path / "bad.toml"
    config.write_text(f'[[tasks]]\nname = "mine"\nenv_id = "{env_id}"\nenv_path = "{env}"\n')
    return config


GOOD_CLASS = """
class MyEnv:
    def reset(self, seed=None):
        return "hi", {}
    def step(self, action):
        return "x", 0.0, True, False, {}
"""


@pytest.mark.parametrize(
    ("source", "requirements", "says"),
    [
        ("class Other:\n    pass\n", "", "defines no class 'MyEnv' at its top level (it defines Other)"),
        ("class MyEnv:\n    def reset(self): ...\n    def step(self, a): ...\n", "", "MyEnv.reset at"),
        (GOOD_CLASS, "trajflow-no-such-distribution-xyz==1.0\n", "cannot be resolved into wheels"),
    ],
    ids=["missing-class", "wrong-signature", "unresolvable-requirement"],
)
def test_a_bad_env_is_refused_at_submission(tmp_path: Path, source: str, requirements: str, says: str) -> None:
    config = bad_env(tmp_path, source, requirements)
    train, rollout = submitted_offline(config, tmp_path / "state")
    for proc in (train, rollout):
        assert proc.returncode == 2, proc.stderr
        assert says in proc.stderr
    assert "task 'mine'" in train.stderr


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("class run:\n    pass\n", "run at "),
        ("def run(task):\n    return 1.0\n", "cannot be called as run(task, seed)"),
        ("", "an agent: program needs its source directory"),
    ],
    ids=["a-class", "wrong-signature", "no-env-path"],
)
def test_a_bad_agent_program_is_refused_at_submission(tmp_path: Path, source: str, says: str) -> None:
    config = bad_env(tmp_path, source, env_id="agent:my_env:run")
    if not source:
        config.write_text('[[tasks]]\nname = "mine"\nenv_id = "agent:my_env:run"\n')
    (proc,) = submitted_offline(config, tmp_path / "state", ("rollout",))
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr


def test_rollout_of_the_own_verifier_example(cli_stack) -> None:
    config = ROOT / "examples" / "arithmetic" / "own_verifier.toml"
    proc = cli_stack.trajflow("rollout", "-c", str(config), "--seed", "3", "--json", timeout=900)
    out = json.loads(proc.stdout)
    assert out["status"] == "completed" and out["reward"] in (1.0, 0.0, -0.1), out  # sum_check's three verdicts
    assert "verifier sum_check:check" in proc.stderr


@pytest.mark.parametrize(
    ("verifier", "source", "says"),
    [
        ("checks:check", "def other(response, reference): ...\n", "defines no function 'check'"),
        ("checks:check", "def check(response): ...\n", "takes 1 positional argument"),
        ("nowhere:check", "", "no verifier module 'nowhere'"),
    ],
    ids=["missing-function", "wrong-signature", "missing-module"],
)
def test_a_bad_verifier_is_refused_at_submission(tmp_path: Path, verifier: str, source: str, says: str) -> None:
    (tmp_path / "rows.jsonl").write_text('{"prompt": "1+1?", "answer": 2}\n')
    (tmp_path / "checks.py").write_text(source)
    config = tmp_path / "bad.toml"
    config.write_text(
        f'[[tasks]]\nname = "mine"\nenv_id = "data:rows"\nenv_path = "rows.jsonl"\nmax_turns = 1\n'
        f'reward_fn = "verifier"\nenv_kwargs = {{ verifier = "{verifier}" }}\n'
    )
    for proc in submitted_offline(config, tmp_path / "state"):
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr
