"""An `agent-cmd:FILE` env: an agent program that is a command line rather than a Python function (a shell script, a
Node or Go harness, a Python script with a shebang), run as is against the sandbox's OpenAI-compatible endpoint, each
chat request one turn, exactly as an `agent:MODULE:FUNCTION` program (`agent.py` holds the contract and the machinery:
the endpoint, the turn loop, budget and `hung`, the guard process, closing).

FILE is a path relative to the program's directory (the user env layer, TRAJFLOW_USERENV_DIR, default
/opt/trajflow/userenv): no whitespace, no `.` or `..` parts, not absolute. It runs as `FILE ARGS...` (its absolute
path as argv[0], so a script finds its siblings with `dirname "$0"`) when it is executable; a file without an execute
bit that starts with `#!` runs through the interpreter its first line names (`#!INTERPRETER [ARG]`, read as Linux
reads it); any other file is refused. ARGS is `env_kwargs["args"]`, a string split as a POSIX shell would
(`shlex.split`), no expansion. The program gets the Python path's environment: OPENAI_BASE_URL, OPENAI_API_KEY,
TRAJFLOW_AGENT_REWARD_FILE, TRAJFLOW_AGENT_TASK (`env_kwargs["task"]` as JSON text, `null` when absent) and
TRAJFLOW_AGENT_SEED (the reset's seed); a fresh empty cwd, stdin closed, stdout discarded, its own process group with
the guard in it (the bootstrap forks the guard and then execs the program, so the program keeps the child's pid and
its exit status is the episode's).

Its reward: exit status 0 and a reward file (a number, or {"reward": number, "info": {..}}, as JSON) give that
reward; status 0 without a reward file is `bad_result`; any other status (or a signal) is `crashed`, with the status
and the end of its stderr. With `env_kwargs["verifier"]`, status 0 runs the verifier instead (`agent_verify.py`: its
`result` has the parsed reward file, or None), whose return value is the reward. Limits: as `agent.py`'s; the
program's environment also holds the runner's own (PATH, PYTHONPATH with the layer first).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path, PurePosixPath
from typing import Any

if __package__:
    from trajflow.envs.agent import DEFAULT_BUDGET_S, AgentEnv
    from trajflow.envs.agent_process import GUARD, USERENV_DIR, AgentError, crashed
else:  # beside the runner in the sandbox image
    from agent import DEFAULT_BUDGET_S, AgentEnv
    from agent_process import GUARD, USERENV_DIR, AgentError, crashed

EXEC_BOOTSTRAP = (
    GUARD
    + r"""
import signal
for name in ("SIGPIPE", "SIGXFSZ"):  # Python ignores them; an exec'd program expects their defaults
    signal.signal(getattr(signal, name), signal.SIG_DFL)
try:
    os.execv(spec["argv"][0], spec["argv"])
except OSError as e:
    sys.stderr.write(f"cannot run {spec['argv'][0]}: {e}\n")
    sys.exit(127)
"""
)
"""The child's program for a command: it forks the guard and replaces itself with the command."""
SHEBANG_BYTES = 256
"""How much of a file's first line is read for its `#!` line."""


def file_problem(file: str) -> str | None:
    """What is wrong with FILE as an `agent-cmd:FILE` name (None: nothing)."""
    parts = PurePosixPath(file).parts
    if not file or any(c.isspace() for c in file):
        return "FILE must be a non-empty path without whitespace"
    if file.startswith("/") or "\\" in file:
        return "FILE must be a path relative to the program's directory (env_path), with / between its parts"
    if any(part in (".", "..") for part in file.split("/")) or not parts:
        return "FILE must not have . or .. parts"
    return None


def split_args(args: object) -> list[str]:
    """`env_kwargs["args"]` as the program's arguments; raises ValueError when it is not a string a shell splits."""
    if not isinstance(args, str):
        raise ValueError(f"args must be a string (split as a shell would), got {args!r:.200}")
    try:
        return shlex.split(args)
    except ValueError as e:
        raise ValueError(f"args {args!r:.200} cannot be split as a shell would: {e}") from None


def command_argv(root: Path, file: str, args: object = "") -> list[str]:
    """The argv that runs `root/file` with `args` (see the module docstring); raises ValueError saying what is
    wrong (a bad name, no such regular file, neither executable nor `#!`)."""
    problem = file_problem(file)
    if problem:
        raise ValueError(f"agent-cmd:{file}: {problem}")
    path = root / file
    if not path.is_file():
        what = "is not a regular file" if path.exists() else "does not exist"
        raise ValueError(f"agent-cmd:{file}: {path} {what}")
    extra = split_args(args)
    if os.stat(path).st_mode & 0o111:
        return [str(path), *extra]
    interpreter = shebang(path)
    if interpreter is None:
        raise ValueError(
            f"agent-cmd:{file}: {path} is neither executable nor a script with a #! line "
            f"(chmod +x it, or start it with e.g. #!/bin/sh)"
        )
    return [*interpreter, str(path), *extra]


def shebang(path: Path) -> list[str] | None:
    """The interpreter (and its one optional argument) of a file that starts with `#!`; None for any other file."""
    with open(path, "rb") as f:
        first = f.readline(SHEBANG_BYTES)
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").strip().split(None, 1)  # Linux: the rest of the line is one argument
    return words or None


class CommandAgentEnv(AgentEnv):
    """An `agent-cmd:FILE` program, driven turn by turn as an `agent:` one (the module docstring has the contract)."""

    bootstrap = EXEC_BOOTSTRAP

    def __init__(
        self,
        file: str,
        task: Any = None,
        budget_s: float = DEFAULT_BUDGET_S,
        args: object = "",
        verifier: str | None = None,
    ) -> None:
        root = Path(os.environ.get("TRAJFLOW_USERENV_DIR", USERENV_DIR))
        self.file = file
        self.argv = command_argv(root, file, args)
        self._init(task, budget_s, verifier)

    def _spec(self) -> dict[str, Any]:
        return {"argv": self.argv}

    def _exit_reward(self, status: int, written: str | None, stderr: str) -> tuple[float, dict[str, Any]]:
        if status != 0:
            raise crashed(status, stderr, f"the agent program {self.file}")
        if written is None:
            raise AgentError(
                "bad_result",
                f"the agent program {self.file} exited with status 0 without writing its reward file "
                "(TRAJFLOW_AGENT_REWARD_FILE: a number or {'reward': number, 'info': {..}} as JSON)",
            )
        return super()._exit_reward(status, written, stderr)
