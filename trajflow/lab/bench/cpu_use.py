"""Where a benchmark's CPU time went: each process `trajflow up` started (with its whole process group), and the
machine as a whole, read from /proc between two moments.

`bench real` takes a `Snapshot` at the start of its steady window and one at its end; `cores_used` turns two of
them into cores busy per process over the interval, with what no listed process accounts for ("other": Docker
sandboxes, the kernel, the bench itself, other tenants of the machine) and the machine's idle share; `cores_waiting`
into the time each process's threads spent runnable but waiting for a CPU (the kernel's schedstat), as cores. A
stage that slows when another runs beside it shows here: as cores taken by the others, or as its own threads
waiting. Linux only (/proc; schedstat needs a kernel with scheduler statistics, which every common distribution
builds); elsewhere a snapshot is empty and the report leaves the lines out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Snapshot:
    at: float
    """time.monotonic() when it was read."""
    groups: dict[str, float] = field(default_factory=dict)
    """Process name -> CPU seconds (user + system) of every live process in its process group."""
    waits: dict[str, float] = field(default_factory=dict)
    """Process name -> seconds its group's live threads spent runnable, waiting for a CPU (schedstat)."""
    busy_s: float = 0.0
    """The machine's CPU seconds spent not idle, since boot (every CPU together)."""
    total_s: float = 0.0
    """The machine's CPU seconds since boot (every CPU together)."""


def stat_fields(text: str) -> tuple[int, float]:
    """(process group, CPU seconds) from one /proc/PID/stat line. The command name may hold spaces and
    parentheses, so the fields are counted from its closing parenthesis."""
    rest = text[text.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state); pgrp is field 5, utime 14, stime 15
    return int(rest[2]), (int(rest[11]) + int(rest[12])) / _TICKS


def schedstat_wait(text: str) -> float:
    """Seconds waiting on a run queue from one /proc/PID/task/TID/schedstat line (run ns, wait ns, timeslices)."""
    return int(text.split()[1]) / 1e9


def _waits(pid_dir: Path) -> float:
    total = 0.0
    for task in (pid_dir / "task").iterdir():
        try:
            total += schedstat_wait((task / "schedstat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # gone, or no scheduler statistics in this kernel
    return total


def machine_seconds(text: str) -> tuple[float, float]:
    """(busy, total) CPU seconds from /proc/stat's first line: idle and iowait count as not busy."""
    line = next(ln for ln in text.splitlines() if ln.startswith("cpu "))
    values = [int(v) for v in line.split()[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice; guest time is inside user already
    total = sum(values[:8])
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (total - idle) / _TICKS, total / _TICKS


def take(processes: Mapping[str, int], proc: Path = PROC) -> Snapshot:
    """Read the CPU seconds of each named process group (`processes`: name -> its leader's pid, which is the
    group id `trajflow up` gives it) and of the machine."""
    by_group: dict[int, float] = {}
    waits: dict[int, float] = {}
    if not (proc / "stat").exists():
        return Snapshot(at=time.monotonic())
    wanted = set(processes.values())
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            group, seconds = stat_fields((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # gone between the listing and the read
        if group in wanted:
            by_group[group] = by_group.get(group, 0.0) + seconds
            try:
                waits[group] = waits.get(group, 0.0) + _waits(entry)
            except OSError:
                pass  # gone between the two reads
    busy, total = machine_seconds((proc / "stat").read_text())
    groups = {name: by_group.get(pid, 0.0) for name, pid in processes.items()}
    waited = {name: waits.get(pid, 0.0) for name, pid in processes.items()}
    return Snapshot(at=time.monotonic(), groups=groups, waits=waited, busy_s=busy, total_s=total)


def cores_used(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """Cores busy on average between two snapshots: each process group present in both, "other" (busy time no
    listed group accounts for) and "idle". A group whose seconds fell (it restarted) counts from zero."""
    wall = after.at - before.at
    if wall <= 0 or after.total_s <= before.total_s:
        return {}
    cores = (after.total_s - before.total_s) / wall  # the machine's CPUs, as the kernel counts them
    used: dict[str, float] = {}
    for name, seconds in after.groups.items():
        if name in before.groups:
            spent = seconds - before.groups[name]
            used[name] = (seconds if spent < 0 else spent) / wall
    busy = (after.busy_s - before.busy_s) / wall
    used["other"] = max(0.0, busy - sum(used.values()))
    used["idle"] = max(0.0, cores - busy)
    return used


def cores_waiting(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """Per process group present in both, the seconds its threads waited for a CPU between two snapshots, over the
    wall time: 0.2 means that on average a fifth of a thread was ready to run and did not. A thread that ended in
    between takes its waits with it, so this is a lower bound."""
    wall = after.at - before.at
    if wall <= 0:
        return {}
    return {n: max(0.0, s - before.waits[n]) / wall for n, s in after.waits.items() if n in before.waits}
