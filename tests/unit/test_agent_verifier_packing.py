"""An agent program's verifier (`env_kwargs["verifier"]`) is checked at submission without importing it: its module
in the program's directory (env_path), its FUNCTION a top-level def taking (task, seed, result); what is wrong is
an EnvSourceError naming the task (the CLI exits 2 with it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trajflow.contracts.tasks import TaskConfig
from trajflow.infra.store import LocalStore
from trajflow.sandbox.user.source import EnvSourceError, check_agent_verifier
from trajflow.sandbox.user.submit import publish_task

PROGRAM = "def solve(task, seed):\n    open('out.txt', 'w').write('done')\n"
CHECKS = """
import os

def verify(task, seed, result):
    return 1.0 if os.path.exists("out.txt") else 0.0

async def loose(task, *rest, strict=False):
    return 1.0

def two(task, seed):
    return 1.0

def four(task, seed, result, extra):
    return 1.0

class Verify:
    pass
"""


def program_dir(tmp_path: Path) -> Path:
    root = tmp_path / "agent"
    (root / "checks").mkdir(parents=True)
    (root / "solver.py").write_text(PROGRAM)
    (root / "checks" / "__init__.py").write_text(CHECKS)
    (root / "run.sh").write_text("#!/bin/sh\necho done > out.txt\n")
    (root / "run.sh").chmod(0o755)
    return root


@pytest.mark.parametrize("env_id", ["agent:solver:solve", "agent-cmd:run.sh"])
def test_a_task_with_a_good_verifier_is_published_with_it(tmp_path: Path, env_id: str) -> None:
    root, said = program_dir(tmp_path), []
    task = TaskConfig(name="t", env_id=env_id, env_path=str(root), env_kwargs={"verifier": "checks:verify"})
    published = publish_task(task, LocalStore(tmp_path / "store"), tmp_path / "wheels", said.append)
    assert published.env_package and published.env_kwargs["verifier"] == "checks:verify"
    check_agent_verifier(env_id, root, "checks:loose")  # async, *rest: callable with three arguments


@pytest.mark.parametrize(
    ("verifier", "says"),
    [
        ("nowhere:verify", "no verifier module 'nowhere' in"),
        ("checks:missing", "defines no function 'missing' at its top level"),
        ("checks:two", r"the verifier two at .*cannot be called as two\(task, seed, result\)"),
        ("checks:four", r"cannot be called as four\(task, seed, result\)"),
        ("checks:Verify", "is a class, not a function; the verifier is a top-level def"),
        ("checks", "verifier must be a string MODULE:FUNCTION"),
        (7, "verifier must be a string MODULE:FUNCTION"),
    ],
)
def test_a_bad_verifier_is_refused_naming_its_task(tmp_path: Path, verifier: str | int, says: str) -> None:
    root = program_dir(tmp_path)
    task = TaskConfig(name="t", env_id="agent:solver:solve", env_path=str(root), env_kwargs={"verifier": verifier})
    with pytest.raises(EnvSourceError, match=f"task 't': agent:solver:solve: .*{says}"):
        publish_task(task, LocalStore(tmp_path / "store"), tmp_path / "wheels", print)
