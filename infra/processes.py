"""Background processes of the embedded stack: start detached, record, check, stop exactly those.

Each started process is recorded with its pid *and* its kernel start time, so `trajflow down` never signals
a process that merely reused a pid. Linux only (reads /proc).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    start_ticks: int
    argv: list[str]
    log: str
    env: dict[str, str] = field(default_factory=dict)
    """The variables it was started with on top of the launcher's environment (its placement)."""
    cpus: list[int] | None = None
    """The CPUs it is pinned to (None: any); a restart keeps both."""


def process_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot), or None if no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie is not running
        return None
    return int(fields[19])


def is_alive(rec: ProcessRecord) -> bool:
    return process_start_ticks(rec.pid) == rec.start_ticks


def python_module(module: str, *args: str, python: str | None = None) -> list[str]:
    """The command line of a child that runs `python -m MODULE ARGS` (this interpreter unless `python`). `-P` keeps
    the working directory off `sys.path`: trajflow started from a user's project runs its own `workflows`, `infra`,
    ... never the project's files of the same names."""
    return [python or sys.executable, "-P", "-m", module, *args]


def log_tail(rec: ProcessRecord, lines: int = 40) -> str:
    """The last `lines` lines of a process's log, so that a start-up failure says why where it is reported (a test's
    state dir, logs included, is gone by the time anyone reads its failure)."""
    try:
        return "\n".join(Path(rec.log).read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(unreadable: {e})"


def same_code_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with PYTHONPATH led by the directory this process imported trajflow from (a checkout, a worktree or
    site-packages), so a child started with it runs the same code as this process."""
    root = str(Path(str(resources.files("trajflow"))).parent)
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)}


def start_detached(
    name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None, cpus: list[int] | None = None
) -> ProcessRecord:
    """Start `argv` in its own session with output to log_dir/NAME.log; it outlives this process. `env` is added
    to this process's environment; `cpus` pins the child (and every thread it starts) to those CPUs."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    pin = None if cpus is None else _pinner(cpus)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            preexec_fn=pin,
        )
    ticks = process_start_ticks(proc.pid)
    if ticks is None:
        raise RuntimeError(f"{name} exited at once; see {log_path}")
    return ProcessRecord(
        name=name, pid=proc.pid, start_ticks=ticks, argv=argv, log=str(log_path), env=dict(env or {}), cpus=cpus
    )


def restart(rec: ProcessRecord, log_dir: Path) -> ProcessRecord:
    """Start a stopped or killed process again with its recorded command line, environment and CPUs."""
    return start_detached(rec.name, rec.argv, log_dir, env=rec.env, cpus=rec.cpus)


def _pinner(cpus: list[int]) -> Callable[[], None]:
    if not cpus:
        raise ValueError("a process cannot be pinned to an empty set of CPUs")
    chosen = set(cpus)

    def pin() -> None:  # runs in the child between fork and exec: the affinity survives exec
        os.sched_setaffinity(0, chosen)

    return pin


class ProcessTable:
    """The json file listing what `trajflow up` started."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "processes.json"

    def load(self) -> list[ProcessRecord]:
        if not self.path.exists():
            return []
        return [ProcessRecord(**r) for r in json.loads(self.path.read_text())]

    def save(self, records: list[ProcessRecord]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(r) for r in records], indent=2))
        os.replace(tmp, self.path)

    def add(self, rec: ProcessRecord) -> None:
        self.save([r for r in self.load() if r.name != rec.name] + [rec])

    def replace(self, rec: ProcessRecord) -> None:
        """Record a restarted process in its predecessor's place (the order is the order `down` reverses)."""
        records = self.load()
        if rec.name not in {r.name for r in records}:
            raise KeyError(f"{rec.name} is not in {self.path}")
        self.save([rec if r.name == rec.name else r for r in records])


def stop(rec: ProcessRecord, timeout_s: float = 15.0) -> bool:
    """SIGTERM the process group, then SIGKILL after the timeout. True if it was running."""
    if not is_alive(rec):
        return False
    _signal_group(rec, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_alive(rec):
            return True
        time.sleep(0.1)
    _signal_group(rec, signal.SIGKILL)
    return True


def kill(rec: ProcessRecord, timeout_s: float = 10.0) -> None:
    """SIGKILL the process group at once (a crash, not a shutdown) and wait until it is gone."""
    _signal_group(rec, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while is_alive(rec):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{rec.name} (pid {rec.pid}) still alive {timeout_s:.0f}s after SIGKILL")
        time.sleep(0.05)


def _signal_group(rec: ProcessRecord, sig: signal.Signals) -> None:
    try:
        os.killpg(rec.pid, sig)  # start_new_session made pid the group leader
    except ProcessLookupError:
        pass
