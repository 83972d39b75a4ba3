"""Owner labels and the liveness check the reaper relies on."""

from __future__ import annotations

import os
import subprocess
import sys

from sandbox import labels


def test_own_labels_describe_a_live_owner() -> None:
    own = labels.owner_labels("worker-a", "abc123")
    assert own[labels.SANDBOX] == "1"
    assert own[labels.OWNER] == "worker-a"
    assert own[labels.OWNER_PID] == str(os.getpid())
    assert labels.owner_alive(own) is True


def test_dead_pid_is_not_alive() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    start = labels.process_start_time(proc.pid)
    proc.wait()
    assert labels.process_start_time(proc.pid) is None
    dead = {labels.OWNER_PID: str(proc.pid), labels.OWNER_START: str(start)}
    assert labels.owner_alive(dead) is False


def test_reused_pid_is_not_alive() -> None:
    start = labels.process_start_time(os.getpid())
    assert start is not None
    reused = {labels.OWNER_PID: str(os.getpid()), labels.OWNER_START: str(start + 1)}
    assert labels.owner_alive(reused) is False


def test_earlier_boot_is_not_alive() -> None:
    own = labels.owner_labels("w", "s")
    own[labels.OWNER_BOOT] = "not-this-boot"
    assert labels.owner_alive(own) is False


def test_missing_or_garbled_labels_say_nothing() -> None:
    assert labels.owner_alive({}) is None
    assert labels.owner_alive({labels.OWNER_PID: "x", labels.OWNER_START: "1"}) is None


def test_process_start_time_handles_odd_command_names() -> None:
    # /proc/PID/stat's field 2 is "(comm)"; a comm with ") " must not shift the fields.
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert isinstance(labels.process_start_time(proc.pid), int)
    finally:
        proc.communicate(b"")
