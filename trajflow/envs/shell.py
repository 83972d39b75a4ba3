"""Shell tasks (SWE-like): a small repository in the sandbox, shell commands as actions, its tests as the reward.

A task is a directory `<tasks_root>/<name>/` holding `task.json` (`description`, `test_command`, optional
`protected`: paths restored from the task before the tests run) and `repo/` (the project with its bug). `reset`
copies `repo/` to `<work_dir>/repo`; each `step` runs the action's command there with `bash -c` (as the
sandbox's unprivileged user, in a new process group, killed at `command_timeout_s`) and answers its output, cut
to `max_output` characters, with the exit code. The episode ends when the agent says `submit` or at `max_turns`;
then the protected test files are restored (an agent cannot pass by editing the tests) and the task's test
command runs: reward 1.0 if it exits 0, else 0.0, with the test output in `info`.

Actions: the command is the body of the first fenced code block (```bash ... ```) if there is one, else the
whole text; a command that is just `submit` ends the episode.
Paths default to the sandbox's (`/opt/trajflow/tasks`, `/work`); `TRAJFLOW_TASKS_ROOT` and `TRAJFLOW_WORK_DIR`
override them, e.g. to run a task on the host.
Limits: stdlib only (it runs inside the sandbox image beside `runner.py`); deterministic given the same actions,
as action replay needs, as long as the commands are (no clocks, no randomness); one episode per instance.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

TASKS_ROOT = "/opt/trajflow/tasks"
WORK_DIR = "/work"
SUBMIT = "submit"
_FENCE = re.compile(r"```[a-zA-Z]*\n?(.*?)```", re.DOTALL)

INSTRUCTIONS = (
    "You are in a shell at the root of a small Python repository. Each reply runs ONE shell command "
    "(put it in a ```bash``` block); you see its output and exit code. Fix the bug so that the tests pass. "
    "Run the tests with: {test_hint}. When you are done, reply with `submit`. You have {max_turns} commands."
)


class ShellTaskError(Exception):
    """The task is missing or malformed (not the agent's fault)."""


def extract_command(action: str) -> str:
    """The command an action asks to run: the first fenced block's body, else the whole text, stripped."""
    match = _FENCE.search(action)
    return (match.group(1) if match else action).strip()


def truncate(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, keeping its head and tail and saying how much was cut."""
    if len(text) <= limit:
        return text
    half = max(limit // 2, 1)
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def run_command(command: str, cwd: Path, timeout_s: float, limit: int) -> tuple[int | None, str]:
    """Run `command` with bash in `cwd`; (exit code or None on timeout, truncated stdout+stderr)."""
    proc = subprocess.Popen(
        ["bash", "-c", command],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so a timeout kills everything it started
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # it may have just exited
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        code = None
    return code, truncate(out.decode(errors="replace"), limit)


def _status(code: int | None, timeout_s: float) -> str:
    if code is None:
        return f"[timed out after {timeout_s:g}s; killed]"
    if code < 0:  # e.g. SIGKILL from the kernel's OOM killer at the sandbox's memory limit
        return f"[killed by signal {-code}]"
    return f"[exit {code}]"


class ShellEnv:
    """One episode of one shell task, GEM-style: `reset(seed)` and `step(action)`."""

    def __init__(
        self,
        task: str,
        *,
        tasks_root: str | None = None,
        work_dir: str | None = None,
        max_turns: int = 10,
        max_output: int = 2000,
        command_timeout_s: float = 20.0,
        test_timeout_s: float = 60.0,
    ) -> None:
        tasks_root = tasks_root or os.environ.get("TRAJFLOW_TASKS_ROOT", TASKS_ROOT)
        work_dir = work_dir or os.environ.get("TRAJFLOW_WORK_DIR", WORK_DIR)
        self.task_dir = Path(tasks_root) / task
        spec_path = self.task_dir / "task.json"
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", task) or not spec_path.is_file():
            raise ShellTaskError(f"no shell task {task!r} under {tasks_root}")
        self.spec: dict[str, Any] = json.loads(spec_path.read_text())
        self.repo = Path(work_dir) / "repo"
        self.max_turns = max_turns
        self.max_output = max_output
        self.command_timeout_s = command_timeout_s
        self.test_timeout_s = test_timeout_s
        self.turn = 0
        self.done = False

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Copy the task's repository to the work dir; the seed is unused (a task is one fixed repository)."""
        if self.repo.exists():
            shutil.rmtree(self.repo)
        shutil.copytree(self.task_dir / "repo", self.repo)
        self.turn, self.done = 0, False
        text = INSTRUCTIONS.format(test_hint=self.spec["test_command"], max_turns=self.max_turns)
        return f"{self.spec['description'].strip()}\n\n{text}", {"task": self.task_dir.name}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.done:
            raise ShellTaskError("the episode is over; reset first")
        self.turn += 1
        command = extract_command(action)
        if command == SUBMIT:
            return self._finish(truncated=False, observation="submitted")
        if not command:
            observation = "(empty command: put one shell command in a ```bash``` block, or reply `submit`)"
        else:
            code, output = run_command(command, self.repo, self.command_timeout_s, self.max_output)
            status = _status(code, self.command_timeout_s)
            observation = f"{output}{status}" if output.endswith("\n") or not output else f"{output}\n{status}"
        if self.turn >= self.max_turns:
            return self._finish(truncated=True, observation=f"{observation}\n(out of commands)")
        return observation, 0.0, False, False, {"turn": self.turn}

    def _finish(self, truncated: bool, observation: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Restore the protected files, run the tests, and end the episode with their verdict as the reward."""
        self.done = True
        for rel in self.spec.get("protected", []):
            source, target = self.task_dir / "repo" / rel, self.repo / rel
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
            target.parent.mkdir(parents=True, exist_ok=True)
            copy = shutil.copytree if source.is_dir() else shutil.copy2
            copy(source, target)
        code, output = run_command(self.spec["test_command"], self.repo, self.test_timeout_s, self.max_output)
        passed = code == 0
        info = {"tests_passed": passed, "test_exit_code": code, "test_output": output, "turn": self.turn}
        verdict = "tests passed" if passed else "tests failed"
        return f"{observation}\n{verdict}", 1.0 if passed else 0.0, not truncated, truncated, info
