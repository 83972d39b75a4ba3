"""Container labels that tie a sandbox to the process that owns it, and the /proc look-ups behind them.

A sandbox container carries its owner's pid and that process's start time (field 22 of /proc/PID/stat,
clock ticks since boot), so a reaper can tell a live owner from a dead one even after the pid is reused.
Limits: Linux only; owners must share the reaper's pid namespace and boot (the boot id is labelled too).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

SANDBOX = "trajflow.sandbox"
OWNER = "trajflow.owner"
OWNER_PID = "trajflow.owner_pid"
OWNER_START = "trajflow.owner_start"
OWNER_BOOT = "trajflow.owner_boot"
SANDBOX_ID = "trajflow.sandbox_id"


def process_start_time(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot, or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after its closing parenthesis.
    fields = stat.rpartition(")")[2].split()
    return int(fields[19])  # field 22 overall; fields[0] is field 3 (state)


def boot_id() -> str:
    """This machine's boot id (changes on every reboot), or "" where the kernel does not expose it."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def owner_labels(owner_id: str, sandbox_id: str) -> dict[str, str]:
    """The labels a sandbox started by this process carries."""
    pid = os.getpid()
    return {
        SANDBOX: "1",
        SANDBOX_ID: sandbox_id,
        OWNER: owner_id,
        OWNER_PID: str(pid),
        OWNER_START: str(process_start_time(pid)),
        OWNER_BOOT: boot_id(),
    }


def owner_alive(labels: Mapping[str, str]) -> bool | None:
    """Whether the process named by these labels is still running; None when the labels do not say."""
    try:
        pid = int(labels[OWNER_PID])
        start = int(labels[OWNER_START])
    except (KeyError, ValueError):
        return None
    boot = labels.get(OWNER_BOOT, "")
    if boot and boot_id() and boot != boot_id():
        return False  # labelled in an earlier boot: that process is gone whatever its pid says now
    return process_start_time(pid) == start
