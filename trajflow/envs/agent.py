"""An `agent:MODULE:FUNCTION` env: a user's unmodified agent program (written on the `openai` client) run inside the
sandbox against an OpenAI-compatible endpoint served there (`agent_http.py`), each chat request one turn.

The program's control flow is inverted onto the runner's reset/step loop:
- `reset(seed)` starts the program and returns at its FIRST chat request: the observation is that request,
  normalised to JSON (`{"messages", "tools"?, "tool_choice", "sampling": {temperature, top_p, max_tokens, stop,
  seed}, "stream", "call": k}`, keys sorted). A program that ends without a request ends the episode at reset: the
  observation is "" and info holds `terminated: true` and `reward` (a reset answer has no other place for them).
- `step(action)` answers the pending request with the model's answer and returns at the program's next request
  (reward 0) or its exit (observation "", terminated, the reward from its return value).
So a sandbox is restored by replaying recorded actions: the program re-runs and its first k requests are answered from
the record; with the same seed (passed to it, and as PYTHONHASHSEED) a deterministic program asks the same again.

The program: `FUNCTION(task, seed)` in MODULE (found on the sandbox's PYTHONPATH, the user env layer first), where
`task` is `env_kwargs["task"]` (any JSON value, None when absent) and `seed` the reset's int; it may be `async`. It runs
as a child process (its own process group, a fresh empty cwd, stdin closed) with OPENAI_BASE_URL, OPENAI_API_KEY (a
dummy), TRAJFLOW_AGENT_REWARD_FILE, TRAJFLOW_AGENT_TASK (the task as JSON text) and TRAJFLOW_AGENT_SEED set. Its
reward, only when it exits with status 0 (a program killed, say by a command it ran, crashed whatever it sent): the
return value, a number or {"reward": number, "info": {..}}, sent to the runner through a pipe that no command the
program runs can write (`ResultPipe`); or, when it returns None, the same written as JSON to TRAJFLOW_AGENT_REWARD_FILE
(a file, which the program's commands can write too: a program that trusts none of them returns its reward); or,
with `env_kwargs["verifier"] = "MODULE:FUNCTION"`, what that returns when run after a program that exited with status
0, in its work directory (`agent_verify.py`: its `result` argument, its budget, its failures). A command line
(`agent-cmd:FILE`, `agent_cmd.py`) runs the same way, its reward from its exit status and reward file.

An action is a JSON object {"content": str|null, "tool_calls": [...]?, "finish_reason"?, "usage"?} or plain text
(the content). A JSON object is read as an answer only when it has "content" or "tool_calls" and no other keys than
these four (so a model's JSON reply is text); tool-call `arguments` may be an object (sent as its JSON text).

Failures raise AgentError, whose `agent_kind` the runner reports: `crashed` (an exit without a result; the message
has the exit status and the end of its stderr), `hung` (no request and no exit within `budget_s` of the last answer,
or of the start; its process group is killed), `malformed_request` (the program got HTTP 400 and is stopped after
a short grace), `bad_result` (its return value or reward file gives no reward). Info: `call` (requests so far),
`agent_seconds` (the program's time since the previous answer), and at the end `exit_status` and the program's info.

The cwd's path is the same in every run in a sandbox (`trajflow-agent-1/work` in its temp dir: the runner is pid 1),
so a harness that tells its model where it runs (Codex does) asks the same again when a restore re-runs it.

Limits: stdlib only. The program's stdout is discarded and its stderr kept only to report a crash. Requests are turns
in arrival order: concurrent requests are served one at a time, and their order is only as deterministic as the
program. An `openai` client that times out or retries a request sends it again (a new turn). Closing (or a new
reset) kills the program's process group and stops the endpoint; if the runner dies without closing it, a guard
process in the group (forked by the bootstrap, blocked on a pipe whose write end only the runner holds) kills the group.
A process the program starts in a new session or process group escapes both. Its stderr file is not capped. A step
lasts as long as the program works between its calls (up to `budget_s`; the last one, a verifier's `budget_s` more):
the host's step timeout must be longer.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

if __package__:
    from trajflow.envs.agent_http import Endpoint, Event, Exchange, parse_action
    from trajflow.envs.agent_process import (
        CALL,
        GUARD,
        STDERR_TAIL,
        AgentError,
        ResultPipe,
        crashed,
        kill_group,
        spawn,
        user_environment,
    )
else:  # beside the runner in the sandbox image
    from agent_http import Endpoint, Event, Exchange, parse_action
    from agent_process import (
        CALL,
        GUARD,
        STDERR_TAIL,
        AgentError,
        ResultPipe,
        crashed,
        kill_group,
        spawn,
        user_environment,
    )

DEFAULT_BUDGET_S = 600.0
"""How long the program may go without a request or an exit after an answer (or after its start)."""
MALFORMED_GRACE_S = 2.0
"""How long a program that sent a malformed request may take to exit on its own before its group is killed."""
API_KEY = "trajflow-sandbox"
BOOTSTRAP = GUARD + CALL + 'call(spec["module"], spec["function"], (spec["task"], spec["seed"]), spec["out"])\n'


def reward_of(value: object, source: str) -> tuple[float, dict[str, Any]]:
    """(reward, info) from a return value or reward file; raises AgentError(bad_result)."""
    reward, info = (value.get("reward"), value.get("info", {})) if isinstance(value, dict) else (value, {})
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise AgentError("bad_result", f"{source} gives no reward: {value!r:.300} (a number or {{'reward': number}})")
    if not isinstance(info, dict):
        raise AgentError("bad_result", f"{source}: its 'info' must be an object, got {info!r:.300}")
    return float(reward), info


class AgentEnv:
    """One agent program at a time, driven turn by turn (the module docstring has the contract)."""

    owns_processes = True
    """The runner closes such an env when it drops it."""
    bootstrap = BOOTSTRAP
    """The child's Python program (`python -c BOOTSTRAP SPEC_FILE`): it forks the guard, then runs the agent."""

    def __init__(
        self, target: str, task: Any = None, budget_s: float = DEFAULT_BUDGET_S, verifier: str | None = None
    ) -> None:
        module, _, function = target.partition(":")
        if not all(part.isidentifier() for part in module.split(".")) or not function.isidentifier():
            raise ValueError(f"an agent env is named agent:MODULE:FUNCTION, not agent:{target}")
        self.module, self.function = module, function
        self._init(task, budget_s, verifier)

    def _init(self, task: Any, budget_s: float, verifier: str | None = None) -> None:
        """Check the task, budget and verifier, and set up the state of an env whose program has not started."""
        if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not budget_s > 0:
            raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s!r}")
        json.dumps(task)  # TypeError unless JSON-safe: it goes to the program as JSON
        problem = None if verifier is None else _verify().verifier_problem(verifier)
        if problem:
            raise ValueError(problem)
        self.task, self.budget_s, self.verifier, self._seed = task, float(budget_s), verifier, 0
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._endpoint: Endpoint | None = None
        self._watcher: threading.Thread | None = None
        self._dir: Path | None = None
        self._guard: int | None = None
        self._result: ResultPipe | None = None
        self._events: queue.Queue[Event] = queue.Queue()
        self._pending: Exchange | None = None
        self._calls = 0
        self._mark = 0.0

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.close()
        self._events, self._pending, self._calls = queue.Queue(), None, 0
        self._endpoint = Endpoint(self._events)
        self._dir = _claim_dir()
        self._seed = 0 if seed is None else int(seed)
        self._proc = self._start(self._seed, self._endpoint.base_url)
        self._watcher = threading.Thread(target=_watch, args=(self._proc, self._events), name="agent-exit", daemon=True)
        self._watcher.start()
        self._mark = time.monotonic()
        observation, reward, terminated, info = self._next()
        return observation, ({**info, "terminated": True, "reward": reward} if terminated else info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._pending is None:
            raise RuntimeError("no request of the agent program waits for an answer: reset first")
        answer = parse_action(action)
        exchange, self._pending = self._pending, None
        exchange.reply(answer)
        self._mark = time.monotonic()
        observation, reward, terminated, info = self._next()
        return observation, reward, terminated, False, info

    def close(self) -> None:
        """Kill the program's process group, stop the endpoint, join their threads, remove the work directory."""
        with self._lock:
            proc, self._proc = self._proc, None
            endpoint, self._endpoint = self._endpoint, None
            watcher, self._watcher = self._watcher, None
            workdir, self._dir = self._dir, None
            guard, self._guard = self._guard, None
            result, self._result = self._result, None
            self._pending = None
        if proc is not None:
            kill_group(proc)
        if result is not None:
            result.join()  # EOF: the group that held its write end is gone
        if guard is not None:
            os.close(guard)
        if watcher is not None:
            watcher.join()
        if endpoint is not None:
            endpoint.close()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
            _CLAIMED.discard(workdir)

    @property
    def pid(self) -> int | None:
        """The running program's pid (its process group's id too); None when none runs."""
        return self._proc.pid if self._proc is not None else None

    def _start(self, seed: int, base_url: str) -> subprocess.Popen[bytes]:
        assert self._dir is not None
        work = self._dir / "work"
        work.mkdir()
        spec = {**self._spec(), "task": self.task, "seed": seed}
        guard, self._guard = os.pipe()  # the runner holds the write end: its death is the guard's EOF
        self._result = result = ResultPipe()
        spec.update(guard=guard, out=result.write_fd)
        (self._dir / "spec.json").write_text(json.dumps(spec))
        env = {**user_environment(seed), "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": API_KEY}
        env.update(ANTHROPIC_BASE_URL=base_url.removesuffix("/v1"), ANTHROPIC_API_KEY=API_KEY)
        env.update(TRAJFLOW_AGENT_REWARD_FILE=str(self._dir / "reward.json"))
        env.update(TRAJFLOW_AGENT_TASK=json.dumps(self.task), TRAJFLOW_AGENT_SEED=str(seed))
        env["NO_PROXY"] = env["no_proxy"] = ",".join(filter(None, ["127.0.0.1,localhost", env.get("NO_PROXY")]))
        try:
            return spawn(self.bootstrap, self._dir / "spec.json", work, env, self._dir / "stderr.log", guard, result)
        finally:
            os.close(guard)
            result.sent()

    def _spec(self) -> dict[str, Any]:
        """What the bootstrap needs to run this program, besides its task, seed, guard and result file."""
        return {"module": self.module, "function": self.function}

    def _next(self) -> tuple[str, float, bool, dict[str, Any]]:
        """Wait for the program's next request or its exit: (observation, reward, terminated, info)."""
        try:
            kind, payload = self._events.get(timeout=max(self._mark + self.budget_s - time.monotonic(), 0.0))
        except queue.Empty:
            pid, calls = self.pid, self._calls
            self.close()
            raise AgentError(
                "hung",
                f"the agent program (pid {pid}) made no request and did not exit within budget_s={self.budget_s:g} s "
                f"of {'its start' if calls == 0 else f'the answer to call {calls}'}; its process group was killed",
            ) from None
        spent = round(time.monotonic() - self._mark, 3)
        if kind == "request":
            self._pending, self._calls = payload, payload.observation["call"]
            return (
                json.dumps(payload.observation, sort_keys=True),
                0.0,
                False,
                {"call": self._calls, "agent_seconds": spent},
            )
        if kind == "malformed":
            self._stop_after_grace()
            raise AgentError("malformed_request", f"{payload}; the program got HTTP 400 and was stopped")
        reward, info = self._ending(payload)
        return "", reward, True, {**info, "call": self._calls, "agent_seconds": spent, "exit_status": payload}

    def _stop_after_grace(self) -> None:
        deadline = time.monotonic() + MALFORMED_GRACE_S
        while True:
            try:
                if self._events.get(timeout=max(deadline - time.monotonic(), 0.0))[0] == "exited":
                    break
            except queue.Empty:
                break
        self.close()

    def _ending(self, status: int) -> tuple[float, dict[str, Any]]:
        """The program exited with `status`: its reward and info (the env is closed either way; a verifier runs in
        its work directory after its group is killed and before the directory is removed)."""
        scratch, result = self._dir, self._result
        assert scratch is not None and result is not None
        reward_file = scratch / "reward.json"
        with open(scratch / "stderr.log", "rb") as log:
            log.seek(max(log.seek(0, os.SEEK_END) - STDERR_TAIL, 0))
            stderr = log.read().decode(errors="replace")
        try:
            self._dir = None  # close() leaves the work directory to this method (and the verifier)
            self.close()  # the group is killed: nothing of it holds the result pipe any more
            # a result counts only from a program that exited with status 0: one killed (by a command it ran, say)
            # after a result reached the pipe crashed
            outcome = result.outcome("the agent program") if status == 0 else None
            written = reward_file.read_text() if reward_file.is_file() and status == 0 else None
            if self.verifier is not None and status == 0 and "unserializable" not in (outcome or {}):
                verify, parsed = _verify(), None if written is None else _json_or_text(written)
                own = verify.program_result((outcome or {}).get("value"), status, parsed)
                return verify.run_verifier(
                    self.verifier, self.task, self._seed, own, scratch, scratch / "work", self.budget_s
                )
        finally:
            self.close()
            shutil.rmtree(scratch, ignore_errors=True)
            _CLAIMED.discard(scratch)
        if outcome is None:
            return self._exit_reward(status, written, stderr)
        if "unserializable" in outcome:
            raise AgentError("bad_result", f"its return value is not JSON: {outcome['unserializable']}")
        if outcome["value"] is None and written is not None:
            return reward_of(_json_or_text(written), "its reward file")
        return reward_of(outcome["value"], "its return value")

    def _exit_reward(self, status: int, written: str | None, stderr: str) -> tuple[float, dict[str, Any]]:
        """The reward of a program that exited with `status` without a return value (`written`: its reward file's
        text, None when it wrote none)."""
        if status == 0 and written is not None:
            return reward_of(_json_or_text(written), "its reward file")
        raise crashed(status, stderr, how="{} without a result")


_CLAIMED: set[Path] = set()


def _claim_dir() -> Path:
    """The program's directory: `trajflow-agent-<this process's pid>` in the temp dir, so that a sandbox's runner (pid
    1) gives every run the same paths (a harness that tells its model its cwd, as Codex does, asks the same again
    when a restore re-runs it); a second env in the same process (tests on a host) gets a fresh name."""
    fixed = Path(tempfile.gettempdir()) / f"trajflow-agent-{os.getpid()}"
    if fixed in _CLAIMED:
        return Path(tempfile.mkdtemp(prefix="trajflow-agent-"))
    shutil.rmtree(fixed, ignore_errors=True)  # left by a runner that died before closing
    fixed.mkdir(mode=0o700)
    _CLAIMED.add(fixed)
    return fixed


def _verify() -> ModuleType:
    """`agent_verify.py`, imported on use (it imports this module)."""
    return importlib.import_module(f"{__package__}.agent_verify" if __package__ else "agent_verify")


def _json_or_text(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return text.strip()


def _watch(proc: subprocess.Popen[bytes], events: queue.Queue[Event]) -> None:
    events.put(("exited", proc.wait()))
