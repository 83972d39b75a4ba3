"""Verifiers under a time limit: each call runs in a reused worker process that is killed when it overruns.

A thread cannot be stopped, so a reward function that loops (a user's bug) or an answer that makes Math-Verify/sympy
compute forever (`9**9**9**9`) would pin a reward-service thread and a core for good. `BoundedRunner.call` runs the
function in one of at most `processes` worker processes instead and waits at most `timeout_s` for its answer: past
it, the worker is killed (SIGKILL, which frees its CPU and memory at once), a fresh one takes its place on the next
call, and the caller gets `VerifierTimedOut`. Workers are reused between calls, so the common path costs one pipe
round trip (pickling the request and the result), not a process start.

- The limit holds per call, from the moment a worker has the request; waiting for a free worker (all `processes`
  busy) is not counted (the reward client's own deadline bounds the whole request).
- Workers come from a `forkserver` (never `fork` from the service's threads, which can inherit a held lock), which
  imports the verifiers' modules once (`preload`), so a replacement worker starts in milliseconds; a worker imports
  them (if the forkserver has not) before it takes its first call, off the clock. A function must be importable by
  its module and name (a module-level function): it is pickled by reference.
- A worker arms `alarm(timeout_s + ORPHAN_GRACE_S)` with the default action (terminate) around each call, so a
  worker that loops after its service died (nobody left to kill it) ends by itself.
- A function that raises: its exception's type, message and traceback come back as `VerifierRaised`, except
  `RewardInputError` (the request's fault), which is raised again as itself. A worker that dies mid-call (a crash,
  out of memory) is `VerifierCrashed`.

Not covered: memory limits (a pathological answer may use memory until the deadline), and cancelling a call early.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import multiprocessing
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

DEFAULT_TIMEOUT_S = 5.0
"""The default limit of one verifier call: far above what a real answer takes (milliseconds; Math-Verify's own
default is 5 s), and below the reward client's 10 s deadline, so a timeout comes back as itself, not as an outage."""
TIMEOUT_ENV = "TRAJFLOW_VERIFIER_TIMEOUT_S"
"""The reward service's time limit per verifier call, in seconds (`--verifier-timeout-s` overrides it)."""
PROCESSES_ENV = "TRAJFLOW_VERIFIER_PROCESSES"
"""How many verifier worker processes the reward service keeps (`--verifier-processes` overrides it; default: the
CPU count)."""
ORPHAN_GRACE_S = 2
"""How long after its deadline a worker ends itself when nobody killed it (its service died)."""
KILL_WAIT_S = 5.0
START_S = 120.0
"""How long a new worker may take to import the verifiers' modules (cold caches, a busy machine)."""


class VerifierTimedOut(Exception):
    """A verifier ran past its time limit; its worker process was killed. Never a score: the answer is unjudged."""

    def __init__(self, name: str, timeout_s: float) -> None:
        super().__init__(
            f"verifier {name!r} timed out after {timeout_s:g} s (its worker process was killed); the answer is not "
            f"scored (limit: {TIMEOUT_ENV} or the reward service's --verifier-timeout-s)"
        )
        self.name = name
        self.timeout_s = timeout_s


class VerifierRaised(Exception):
    """A verifier raised in its worker: `type_name`, the message and `traceback` (text) of what it raised."""

    def __init__(self, name: str, type_name: str, message: str, tb: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.name = name
        self.type_name = type_name
        self.traceback = tb


class VerifierCrashed(Exception):
    """A verifier's worker process died during the call (a crash, out of memory, `os._exit`)."""


def timeout_from_env() -> float:
    """`$TRAJFLOW_VERIFIER_TIMEOUT_S`, else `DEFAULT_TIMEOUT_S`; a value that is not a positive number: ValueError."""
    raw = os.environ.get(TIMEOUT_ENV, "")
    return positive_seconds(raw, TIMEOUT_ENV) if raw.strip() else DEFAULT_TIMEOUT_S


def processes_from_env() -> int:
    """`$TRAJFLOW_VERIFIER_PROCESSES`, else the CPU count."""
    raw = os.environ.get(PROCESSES_ENV, "").strip()
    if not raw:
        return os.cpu_count() or 1
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{PROCESSES_ENV} must be a whole number of at least 1, got {raw!r}")
    return int(raw)


def positive_seconds(raw: str, what: str) -> float:
    """`raw` as a finite number of seconds above 0; a clear ValueError naming `what` otherwise."""
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, got {raw!r}")
    return value


def _serve(conn: Connection, timeout_s: float, preload: list[str]) -> None:
    """A worker's loop: "ready" once `preload` is imported, then (fn, args) in, ("ok", value) | ("input", message) |
    ("raised", type, message, tb) out."""
    from trajflow.rewards.registry import RewardInputError

    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group; the service ends us
    for module in preload:  # loaded already when the forkserver preloaded them; else imported here, off the clock
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    conn.send("ready")
    while True:
        try:
            fn, args = conn.recv()
        except EOFError:  # the service closed its end (or died)
            return
        signal.alarm(math.ceil(timeout_s) + ORPHAN_GRACE_S)
        try:
            answer: tuple[Any, ...] = ("ok", fn(*args))
        except RewardInputError as e:
            answer = ("input", str(e))
        except Exception as e:
            answer = ("raised", type(e).__name__, str(e), traceback.format_exc())
        finally:
            signal.alarm(0)
        conn.send(answer)


def _main_modules() -> list[str]:
    """The main module, for the forkserver to import once: multiprocessing prepares every worker by running it
    again (as `__mp_main__`), which is cheap only when its imports are loaded already. `__main__` stands for a
    script (imported once, then skipped), the module's name for `python -m MODULE`."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    return ["__main__", name] if name and not name.endswith("__main__") else ["__main__"]


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, ctx: Any, timeout_s: float, preload: list[str]) -> None:
        self.conn, child = multiprocessing.Pipe()
        self.process: BaseProcess = ctx.Process(target=_serve, args=(child, timeout_s, preload), daemon=True)
        self.process.start()
        child.close()
        try:  # its start (imports) is not counted against a call's limit
            if not self.conn.poll(START_S) or self.conn.recv() != "ready":
                raise VerifierCrashed(f"a verifier worker process did not start within {START_S:g} s")
        except (EOFError, OSError) as e:
            self.process.join(KILL_WAIT_S)
            raise VerifierCrashed(
                f"a verifier worker process exited at its start (code {self.process.exitcode})"
            ) from e
        except VerifierCrashed:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL and reap; the process is gone when this returns (or KILL_WAIT_S passed)."""
        self.conn.close()
        if self.process.is_alive():
            self.process.kill()
        self.process.join(KILL_WAIT_S)


class BoundedRunner:
    """Runs module-level functions in at most `processes` reused worker processes, each call within `timeout_s`.

    Thread-safe: the reward service calls it from its request threads. `close()` kills every worker."""

    def __init__(self, timeout_s: float, processes: int, preload: Iterable[str] = ()) -> None:
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s}")
        if processes < 1:
            raise ValueError(f"processes must be at least 1, got {processes}")
        self.timeout_s = timeout_s
        self.processes = processes
        self._ctx = multiprocessing.get_context("forkserver")
        # the forkserver imports these once; every worker forked from it starts with them loaded
        self._preload = sorted({"trajflow.rewards.registry", *preload})
        self._ctx.set_forkserver_preload(sorted({*self._preload, *_main_modules()}))
        self._slots = threading.BoundedSemaphore(processes)
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._closed = False

    def call(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` in a worker, within the time limit. Raises VerifierTimedOut, VerifierRaised, VerifierCrashed,
        or the function's RewardInputError; `name` names the verifier in their messages."""
        with self._slots:
            worker = self._take()
            try:
                answer = self._ask(worker, name, fn, args)
            except BaseException:
                self._drop(worker)  # timed out, crashed, or could not take the request: never reused
                raise
            self._give_back(worker)
        if answer[0] == "ok":
            return answer[1]
        if answer[0] == "input":
            from trajflow.rewards.registry import RewardInputError

            raise RewardInputError(answer[1])
        raise VerifierRaised(name, *answer[1:])

    def _ask(self, worker: _Worker, name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, ...]:
        try:
            worker.conn.send((fn, args))
            if not worker.conn.poll(self.timeout_s):
                raise VerifierTimedOut(name, self.timeout_s)
            return worker.conn.recv()
        except (EOFError, OSError) as e:  # the worker died, or close() killed it
            worker.process.join(KILL_WAIT_S)
            raise VerifierCrashed(
                f"verifier {name!r}: its worker process died during the call (exit code {worker.process.exitcode})"
            ) from e

    def _take(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise RuntimeError("the verifier runner is closed")
            worker = self._idle.pop() if self._idle else None
        if worker is None or not worker.process.is_alive():
            if worker is not None:
                worker.kill()
            worker = _Worker(self._ctx, self.timeout_s, self._preload)
        with self._lock:
            self._busy.add(worker)
        return worker

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            self._busy.discard(worker)
            if not self._closed:
                self._idle.append(worker)
                return
        worker.kill()

    def _drop(self, worker: _Worker) -> None:
        with self._lock:
            self._busy.discard(worker)
        worker.kill()

    def pids(self) -> list[int]:
        """The process ids of the live workers (idle and busy)."""
        with self._lock:
            workers = [*self._idle, *self._busy]
        return [w.process.pid for w in workers if w.process.pid is not None and w.process.is_alive()]

    def close(self) -> None:
        """Kill every worker; calls after this raise RuntimeError. A busy worker's call ends as VerifierCrashed."""
        with self._lock:
            self._closed = True
            workers, self._idle = [*self._idle, *self._busy], []
        for worker in workers:
            worker.kill()


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "PROCESSES_ENV",
    "TIMEOUT_ENV",
    "BoundedRunner",
    "VerifierCrashed",
    "VerifierRaised",
    "VerifierTimedOut",
    "processes_from_env",
    "timeout_from_env",
]
