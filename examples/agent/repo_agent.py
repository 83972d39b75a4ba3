"""A small tool-using agent on the `openai` client, trained by trajflow as `agent:repo_agent:solve` (issue 26): it
answers a question about a tiny repository (`tinyrepo/`, shipped beside this file) by running shell commands in a
copy of it.

The model (SmolLM2 by default, whose chat template has no tool support) uses its one tool through text, not the
OpenAI `tools` parameter: each reply is either one shell command in a ```bash block, which the agent runs in the
repository (a few seconds at most, its output cut to OUTPUT_CHARS) and whose output is the next user message, or a
line `ANSWER: <text>`, which ends the episode. Any other reply gets a short corrective message. After
`max_tool_turns` replies without an answer the episode ends with reward 0. The reward is 1.0 when the answer matches
the question's (case, whitespace, a trailing period and surrounding quotes or backticks do not count), else 0.

`solve(task, seed)`: the question is `seed % len(QUESTIONS)`, unless `task` names one. `task` is None, a question's
index, or an object (or its JSON text: a run config's env kwargs hold only scalars) with any of `question`,
`max_tool_turns` (4) and `max_tokens` (96, per reply). The program knows nothing of trajflow: it reads
OPENAI_BASE_URL and OPENAI_API_KEY like any `openai` program, and its return value is the reward.

Deterministic given its seed and the model's answers (trajflow restores a lost sandbox by replaying them): no
randomness, and the repository's copy has fixed timestamps. A command whose output varies on its own (`date`, `pwd`:
the copy's directory has a fresh name) makes a replay report the program as non-deterministic. Not covered: a
command's background processes outlive it (until the episode ends, when trajflow kills the program's process group),
and the answers are stored only as sha256 digests in `questions.json`, so a policy that reads this example's own
files through the shell (they are in the sandbox) finds the questions but not the answers.
"""

# The sandbox's env layer installs `openai` from requirements.txt; the project's own environment need not have it.
# pyright: reportMissingImports=false

from __future__ import annotations

import hashlib
import json
import os
import re
import selectors
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

HERE = Path(__file__).resolve().parent
REPO = HERE / "tinyrepo"
QUESTIONS: list[dict[str, str]] = json.loads((HERE / "questions.json").read_text())["questions"]
"""Each {"question": text, "answer_sha256": the sha256 of its normalised answer (see `normalise`)}."""
OPTIONS = {"question": None, "max_tool_turns": 4, "max_tokens": 96}
COMMAND_TIMEOUT_S = 5.0
OUTPUT_CHARS = 1500
FIXED_MTIME = 1_704_067_200  # 2024-01-01: `ls -l` shows the same dates in every episode
TEMPERATURE = 1.0  # trajflow samples with the run config's sampling; this is what an OpenAI server would use

SYSTEM = """You answer a question about a small code repository. You are in its directory and can run shell commands.
To run a command, reply with exactly one command in a bash block, like this:
```bash
cat README.md
```
You will then see its output. When you know the answer, reply with one line:
ANSWER: <the answer>"""
CORRECTION = "Reply with one shell command in a ```bash block, or with one line `ANSWER: <the answer>`."
LAST_CALL = "No commands left: reply now with `ANSWER: <the answer>`."

ANSWER_LINE = re.compile(r"^\s*ANSWER:\s*(.*?)\s*$", re.MULTILINE)
BASH_BLOCK = re.compile(r"```(?:bash|sh|shell)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def solve(task: Any, seed: int) -> dict[str, Any]:
    options = _options(task)
    index = options["question"] if options["question"] is not None else seed % len(QUESTIONS)
    question = QUESTIONS[index]
    client = OpenAI(max_retries=0, timeout=3600.0)  # a retried request would be a second turn; decode may queue
    model = next((m.id for m in client.models.list()), "policy")
    repo = Path(tempfile.mkdtemp(prefix="tinyrepo-", dir=Path.cwd()))
    try:
        _copy_repo(repo)
        files = ", ".join(sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()))
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Files: {files}\nQuestion: {question['question']}"},
        ]
        tool_turns = options["max_tool_turns"]
        for turn in range(1, tool_turns + 2):
            response = client.chat.completions.create(
                model=model, messages=messages, max_tokens=options["max_tokens"], temperature=TEMPERATURE
            )
            reply = response.choices[0].message.content or ""
            answer = ANSWER_LINE.search(reply)
            if answer is not None:
                right = _digest(answer.group(1)) == question["answer_sha256"]
                return _result(1.0 if right else 0.0, turn, answer.group(1), index)
            if turn > tool_turns:
                break
            command = BASH_BLOCK.search(reply)
            said = run_command(command.group(1).strip(), repo) if command else CORRECTION
            if turn == tool_turns:
                said = f"{said}\n{LAST_CALL}"
            messages.append({"role": "assistant", "content": reply})
            messages.append({"role": "user", "content": said})
        return _result(0.0, tool_turns + 1, None, index)
    finally:
        shutil.rmtree(repo, ignore_errors=True)


def normalise(answer: str) -> str:
    """Lower case, single spaces, without surrounding quotes or backticks or a trailing period."""
    text, before = " ".join(answer.split()).lower(), ""
    while text != before:
        before, text = text, text.removesuffix(".").strip()
        if len(text) > 1 and text[0] == text[-1] and text[0] in "\"'`":
            text = text[1:-1].strip()
    return text


def run_command(command: str, cwd: Path, timeout_s: float = COMMAND_TIMEOUT_S, limit: int = OUTPUT_CHARS) -> str:
    """Run `command` with /bin/sh in `cwd`: its output (stdout and stderr) and exit status, as the model sees them.

    The shell stays in this program's process group (so trajflow's kill of the group reaches it); it is killed at
    the timeout or once its output passes `limit`, and the pipe is read directly, so a background process that keeps
    the pipe open cannot hold the agent."""
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command], cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert proc.stdout is not None
    output, deadline, stopped = bytearray(), time.monotonic() + timeout_s, ""
    with proc.stdout, selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while not stopped:
            if len(output) > limit * 4:  # bytes: room for multi-byte characters before the cut
                stopped = "too much output"
            elif not selector.select(max(deadline - time.monotonic(), 0.0)):
                stopped = f"timed out after {timeout_s:g} s"
            elif not (chunk := os.read(proc.stdout.fileno(), 4096)):
                break  # the end of its output: the shell is exiting
            else:
                output += chunk
    try:
        status = None if stopped else proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
    except subprocess.TimeoutExpired:  # it closed its output but goes on
        stopped = f"timed out after {timeout_s:g} s"
    if stopped:
        proc.kill()
        proc.wait()
    ended = f"(stopped: {stopped})" if stopped else f"(exit status {status})"
    text = output.decode(errors="replace").rstrip("\n")
    if len(text) > limit:
        text = text[:limit] + f"\n... (output cut at {limit} characters)"
    return f"$ {command}\n{text or '(no output)'}\n{ended}"


def _options(task: Any) -> dict[str, Any]:
    if isinstance(task, str):
        task = json.loads(task)
    if task is None:
        task = {}
    elif isinstance(task, int) and not isinstance(task, bool):
        task = {"question": task}
    if not isinstance(task, dict) or not task.keys() <= OPTIONS.keys():
        raise ValueError(f"task must be None, a question's index or an object with keys {sorted(OPTIONS)}: {task!r}")
    options = {**OPTIONS, **task}
    question, tool_turns, max_tokens = options["question"], options["max_tool_turns"], options["max_tokens"]
    if question is not None and not (isinstance(question, int) and 0 <= question < len(QUESTIONS)):
        raise ValueError(f"question must be an index below {len(QUESTIONS)}, got {question!r}")
    if not (isinstance(tool_turns, int) and tool_turns >= 0 and isinstance(max_tokens, int) and max_tokens >= 1):
        raise ValueError(f"max_tool_turns must be an int >= 0 and max_tokens one >= 1, got {task!r}")
    return options


def _copy_repo(repo: Path) -> None:
    """A fresh copy of tinyrepo in `repo`, every timestamp the same, so commands cannot damage the shipped one."""
    shutil.copytree(REPO, repo, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", ".*"))
    for path in [*repo.rglob("*"), repo]:
        os.utime(path, (FIXED_MTIME, FIXED_MTIME))


def _digest(answer: str) -> str:
    return hashlib.sha256(normalise(answer).encode()).hexdigest()


def _result(reward: float, turns: int, answer: str | None, index: int) -> dict[str, Any]:
    return {"reward": reward, "info": {"turns": turns, "answer": answer, "question": index}}
