"""An agent program's verifier: `env_kwargs["verifier"] = "MODULE:FUNCTION"` on an `agent:` or `agent-cmd:` task
(`agent.py`, `agent_cmd.py`) gives the episode's reward from a check run after the program, in the sandbox.

When the program exits with status 0 (an `agent:` one by returning, or by `sys.exit(0)`), the runner calls
`FUNCTION(task, seed, result)` from MODULE (found as the program's module is: the user env layer first on PYTHONPATH;
it may be `async`), where `task` and `seed` are the program's and `result` the program's own outcome:

    {"value": <its return value, None for an agent-cmd: program or none>,
     "exit_status": 0,
     "reward_file": <its reward file parsed as JSON (its text when not JSON), None when it wrote none>}

It runs as a child process (its own process group with the guard, stdin closed, stdout discarded, no endpoint: no
OPENAI_BASE_URL) in the program's own work directory (its cwd, so the files the program left there, e.g. a repository
it edited, are there to inspect), with TRAJFLOW_AGENT_TASK and TRAJFLOW_AGENT_SEED set, and may take `budget_s`.
Its return value, a number or {"reward": number, "info": {..}}, is the episode's reward, whatever the program's own
reward was (the program need not give one); its info joins the episode's, with `"verifier": "MODULE:FUNCTION"`.

Failures: a program that exits otherwise stays `crashed` (the verifier is not run), one whose return value is not
JSON stays `bad_result`; a verifier that raises (the message has the end of its stderr), returns no reward (or a
value that is not JSON) or runs past `budget_s` (its process group is killed) is `bad_result`, naming the verifier.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

if __package__:
    from trajflow.envs.agent import reward_of
    from trajflow.envs.agent_process import (
        CALL,
        GUARD,
        STDERR_TAIL,
        AgentError,
        ResultPipe,
        kill_group,
        spawn,
        user_environment,
    )
else:  # beside the runner in the sandbox image
    from agent import reward_of
    from agent_process import CALL, GUARD, STDERR_TAIL, AgentError, ResultPipe, kill_group, spawn, user_environment

BOOTSTRAP = (
    GUARD
    + CALL
    + 'module, _, function = spec["verifier"].partition(":")\n'
    + 'call(module, function, (spec["task"], spec["seed"], spec["result"]), spec["out"])\n'
)
"""The verifier's child program (`python -c BOOTSTRAP SPEC_FILE`): it forks the guard, then calls the verifier."""


def verifier_problem(verifier: object) -> str | None:
    """What is wrong with `env_kwargs["verifier"]` as a name (None: nothing)."""
    module, _, function = verifier.partition(":") if isinstance(verifier, str) else ("", "", "")
    if module and all(part.isidentifier() for part in module.split(".")) and function.isidentifier():
        return None
    return f"verifier must be a string MODULE:FUNCTION (e.g. 'check:verify'), got {verifier!r:.200}"


def program_result(value: object, status: int, written: object) -> dict[str, Any]:
    """The `result` a verifier gets (see the module docstring)."""
    return {"value": value, "exit_status": status, "reward_file": written}


def run_verifier(
    verifier: str, task: Any, seed: int, result: dict[str, Any], scratch: Path, cwd: Path, budget_s: float
) -> tuple[float, dict[str, Any]]:
    """Run `verifier` on the program's `result` in `cwd` (its spec, verdict and stderr in `scratch`): the episode's
    (reward, info); raises AgentError(bad_result) naming it."""
    spec_file = scratch / "verifier.json"
    guard, keep = os.pipe()  # the runner holds the write end: its death is the guard's EOF
    verdict = ResultPipe()  # the verifier's return value, which nothing the program left behind can write
    try:
        spec = {"verifier": verifier, "task": task, "seed": seed, "result": result, "out": verdict.write_fd}
        spec_file.write_text(json.dumps({**spec, "guard": guard}))
        env = user_environment(seed)
        env.update(TRAJFLOW_AGENT_TASK=json.dumps(task), TRAJFLOW_AGENT_SEED=str(seed))
        proc = spawn(BOOTSTRAP, spec_file, cwd, env, scratch / "verifier.log", guard, verdict)
    except BaseException:
        os.close(keep)
        raise
    finally:
        os.close(guard)
        verdict.sent()
    try:
        status = proc.wait(timeout=budget_s)
    except subprocess.TimeoutExpired:
        status = None
    finally:
        kill_group(proc)  # what it left running too
        os.close(keep)
        verdict.join()
    if status is None:
        raise AgentError(
            "bad_result",
            f"the verifier {verifier} did not finish within budget_s={budget_s:g} s; its process group was killed",
        )
    outcome = verdict.outcome(f"the verifier {verifier}") if status == 0 else None
    if outcome is None:
        with open(scratch / "verifier.log", "rb") as log:
            log.seek(max(log.seek(0, os.SEEK_END) - STDERR_TAIL, 0))
            tail = log.read().decode(errors="replace")
        ended = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
        raise AgentError(
            "bad_result", f"the verifier {verifier} {ended} without a verdict; the end of its stderr:\n{tail}"
        )
    if "unserializable" in outcome:
        raise AgentError(
            "bad_result", f"the verifier {verifier}'s return value is not JSON: {outcome['unserializable']}"
        )
    reward, info = reward_of(outcome["value"], f"the verifier {verifier}")
    return reward, {**info, "verifier": verifier}
