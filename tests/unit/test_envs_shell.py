"""The shell-task env on the host (no Docker): every shipped task is unsolved as shipped and solved by its
reference solution; the reward comes from the task's own tests, which the agent cannot edit its way past."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from trajflow.envs import runner, shell
from trajflow.sandbox.images import SHELL_TASKS_DIR, shell_task_names

TASKS = shell_task_names()


def _env(task: str, tmp_path: Path, **kwargs: object) -> shell.ShellEnv:
    return shell.ShellEnv(task, tasks_root=str(SHELL_TASKS_DIR), work_dir=str(tmp_path), **kwargs)  # type: ignore[arg-type]


def test_at_least_five_tasks_ship() -> None:
    assert len(TASKS) >= 5, TASKS


@pytest.mark.parametrize("task", TASKS)
def test_task_as_shipped_fails_its_tests(task: str, tmp_path: Path) -> None:
    env = _env(task, tmp_path)
    observation, info = env.reset(seed=0)
    assert "submit" in observation and info == {"task": task}
    _, reward, terminated, truncated, info = env.step("submit")
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info["tests_passed"] is False and info["test_exit_code"] not in (0, None)


@pytest.mark.parametrize("task", TASKS)
def test_reference_solution_passes(task: str, tmp_path: Path) -> None:
    env = _env(task, tmp_path)
    env.reset(seed=0)
    solution = (SHELL_TASKS_DIR / task / "solution.sh").read_text()
    observation, reward, terminated, _, _ = env.step(f"I will fix it.\n```bash\n{solution}```")
    assert observation.endswith("[exit 0]") and (reward, terminated) == (0.0, False)
    _, reward, terminated, _, info = env.step("```\nsubmit\n```")
    assert (reward, terminated, info["tests_passed"]) == (1.0, True, True), info["test_output"]


def test_editing_the_tests_does_not_pass(tmp_path: Path) -> None:
    env = _env("slugify", tmp_path)
    env.reset(seed=0)
    env.step("```bash\nprintf 'import unittest\\n' > tests/test_text.py\n```")  # tests that test nothing
    _, reward, _, _, info = env.step("submit")
    assert reward == 0.0 and "FAILED" in info["test_output"]


def test_turn_limit_ends_the_episode_with_the_tests_verdict(tmp_path: Path) -> None:
    env = _env("merge-intervals", tmp_path, max_turns=2)
    env.reset(seed=0)
    assert env.step("ls")[2:4] == (False, False)
    observation, reward, terminated, truncated, info = env.step(
        (SHELL_TASKS_DIR / "merge-intervals" / "solution.sh").read_text()
    )
    assert (reward, terminated, truncated, info["tests_passed"]) == (1.0, False, True, True)
    assert "out of commands" in observation
    with pytest.raises(shell.ShellTaskError):
        env.step("ls")


def test_a_hung_command_is_killed_with_its_children(tmp_path: Path) -> None:
    env = _env("lru-cache", tmp_path, command_timeout_s=0.5)
    env.reset(seed=0)
    started = time.monotonic()
    observation, *_ = env.step("sleep 30 & sleep 30; echo never")
    assert time.monotonic() - started < 5
    assert "timed out after 0.5s" in observation and "never" not in observation


def test_output_is_truncated(tmp_path: Path) -> None:
    env = _env("lru-cache", tmp_path, max_output=100)
    env.reset(seed=0)
    observation, *_ = env.step("python3 -c \"print('x' * 10000)\"")
    assert "characters cut" in observation and len(observation) < 300


def test_reset_restores_a_fresh_repository(tmp_path: Path) -> None:
    env = _env("stats-median", tmp_path)
    env.reset(seed=0)
    env.step("rm stats.py")
    env.reset(seed=0)
    assert (tmp_path / "repo" / "stats.py").is_file()


def test_extract_command() -> None:
    assert shell.extract_command("run this:\n```bash\nls -la\n```\nthanks") == "ls -la"
    assert shell.extract_command("```\nsubmit\n```") == "submit"
    assert shell.extract_command("  pwd  ") == "pwd"


def test_unknown_task(tmp_path: Path) -> None:
    with pytest.raises(shell.ShellTaskError):
        _env("../../etc", tmp_path)


def test_runner_hosts_shell_tasks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJFLOW_TASKS_ROOT", str(SHELL_TASKS_DIR))
    monkeypatch.setenv("TRAJFLOW_WORK_DIR", str(tmp_path))
    host = runner.EnvHost(runner.GemLoader("shell:slugify"))
    reply = host.handle({"op": "reset", "env_id": "shell:slugify", "seed": 0, "env_kwargs": {"max_turns": 3}})
    assert reply["ok"] and "slug" in reply["observation"]
    reply = host.handle({"op": "step", "action": "submit"})
    assert reply["ok"] and reply["reward"] == 0.0 and reply["terminated"] is True
    assert reply["info"]["tests_passed"] is False
    unknown = runner.answer(host, b'{"op": "reset", "env_id": "shell:nope", "seed": 0}')
    assert unknown["error"]["type"] == "UnknownEnv"
    bad = runner.answer(host, b'{"op": "reset", "env_id": "shell:slugify", "seed": 0, "env_kwargs": {"x": 1}}')
    assert bad["error"]["type"] == "BadRequest"
