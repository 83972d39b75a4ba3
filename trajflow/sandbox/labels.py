"""Container labels that tie a sandbox to the process that owns it, and the /proc look-ups behind them.

A sandbox container carries its owner's pid and that process's start time (field 22 of /proc/PID/stat,
clock ticks since boot), so a reaper can tell a live owner from a dead one even after the pid is reused. A pid
means something only in its pid namespace: env workers in containers (`trajflow up --hosts`) share one Docker
engine but each has its own. So the owner's pid namespace is labelled, and a reaper judges only sandboxes of
its own namespace; those of another namespace are not its to judge, except those labelled with the reaper's
own host name (`TRAJFLOW_HOST_NAME`, unique per engine), which an earlier run of the same host (a restarted
container, a new namespace) left behind. Sandboxes labelled before namespaces were (no namespace label) are
judged only by a reaper in the initial pid namespace, where every earlier owner ran.
An env worker that runs in a container on the same engine (an env host of `trajflow up --hosts`) also labels that
container's id and start time: a reaper in any namespace on the engine can then tell that the owner is gone when
its container is gone, stopped or restarted since (`trajflow.sandbox.reaper`), which is how one host's sweep
removes the sandboxes of another host's dead worker.
Limits: Linux only; a namespace's id can be reused after it is gone (the boot id and start time still guard
the pid); two live workers must never share a host name on one engine.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trajflow.contracts import names

SANDBOX = names.LABEL_SANDBOX
OWNER = "trajflow.owner"
OWNER_PID = "trajflow.owner_pid"
OWNER_START = "trajflow.owner_start"
OWNER_BOOT = "trajflow.owner_boot"
OWNER_PIDNS = "trajflow.owner_pidns"
OWNER_HOST = names.LABEL_OWNER_HOST
OWNER_CONTAINER = "trajflow.owner_container"
OWNER_CONTAINER_STARTED = "trajflow.owner_container_started"
SANDBOX_ID = "trajflow.sandbox_id"
INITIAL_PIDNS = "pid:[4026531836]"
"""The kernel's initial pid namespace (PROC_PID_INIT_INO): processes not in any container."""


def pid_namespace() -> str:
    """This process's pid namespace, e.g. `pid:[4026531836]`, or "" where /proc does not say."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


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


@dataclass(frozen=True)
class OwnerContainer:
    """The container an owner runs in, on the engine its sandboxes run on."""

    id: str
    started_at: str
    """Docker's `State.StartedAt`: a restarted container has a new one (and none of the old processes)."""


_CONTAINER_DIR = re.compile(r"/containers/([0-9a-f]{64})/")


def container_ids_in_mountinfo(mountinfo: str) -> list[str]:
    """Ids of Docker containers whose files (hostname, hosts, resolv.conf under /var/lib/docker/containers/ID/) are
    mounted here: inside a container, its own id (and nothing else, unless someone mounted another's files)."""
    return sorted({m.group(1) for m in _CONTAINER_DIR.finditer(mountinfo)})


def owner_labels(
    owner_id: str, sandbox_id: str, host_name: str = "", container: OwnerContainer | None = None
) -> dict[str, str]:
    """The labels a sandbox started by this process carries (`host_name`: the worker's host, when placed;
    `container`: the container the worker runs in, on the sandbox's engine)."""
    pid = os.getpid()
    placed = {OWNER_CONTAINER: container.id, OWNER_CONTAINER_STARTED: container.started_at} if container else {}
    return {
        SANDBOX: "1",
        SANDBOX_ID: sandbox_id,
        OWNER: owner_id,
        OWNER_PID: str(pid),
        OWNER_START: str(process_start_time(pid)),
        OWNER_BOOT: boot_id(),
        OWNER_PIDNS: pid_namespace(),
        OWNER_HOST: host_name,
        **placed,
    }


def owner_alive(labels: Mapping[str, str], host_name: str = "") -> bool | None:
    """Whether the process named by these labels is still running, as a reaper on `host_name` (its
    `TRAJFLOW_HOST_NAME`, "" when not placed) sees it; None when the labels do not say or the owner is not this
    reaper's to judge (another pid namespace, another host)."""
    try:
        pid = int(labels[OWNER_PID])
        start = int(labels[OWNER_START])
    except (KeyError, ValueError):
        return None
    boot = labels.get(OWNER_BOOT, "")
    if boot and boot_id() and boot != boot_id():
        return False  # labelled in an earlier boot: that process is gone whatever its pid says now
    theirs, mine = labels.get(OWNER_PIDNS, ""), pid_namespace()
    if not theirs and mine != INITIAL_PIDNS:
        return None  # labelled before namespaces were: its owner ran outside any container, not beside us
    if theirs and theirs != mine:
        if host_name and labels.get(OWNER_HOST, "") == host_name:
            return False  # an earlier run of this very host (a restarted container has a new namespace)
        return None  # another host's or container's pid: meaningless here
    return process_start_time(pid) == start
