"""Owner labels and the liveness check the reaper relies on."""

from __future__ import annotations

import os
import subprocess
import sys

from trajflow.sandbox import labels


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


def test_own_labels_name_the_pid_namespace_and_host() -> None:
    own = labels.owner_labels("w", "s", "stack-env")
    assert own[labels.OWNER_PIDNS] == labels.pid_namespace() and own[labels.OWNER_PIDNS].startswith("pid:[")
    assert own[labels.OWNER_HOST] == "stack-env"


def test_a_dead_owner_in_another_pid_namespace_is_not_ours_to_judge() -> None:
    # A sandbox of an env worker in a container: its pid means nothing here, so even a pid that names no process
    # in this namespace (or a different process) must not make it an orphan.
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    start = labels.process_start_time(proc.pid)
    proc.wait()
    theirs = {
        **labels.owner_labels("w", "s", "other-host"),
        labels.OWNER_PID: str(proc.pid),
        labels.OWNER_START: str(start),
        labels.OWNER_PIDNS: "pid:[4026532999]",
    }
    assert labels.owner_alive(theirs) is None
    assert labels.owner_alive(theirs, host_name="my-host") is None
    # ... unless it carries this reaper's own host name: an earlier run of this host left it behind
    assert labels.owner_alive(theirs, host_name="other-host") is False


def test_same_namespace_is_judged_by_pid_whatever_the_host_name() -> None:
    own = labels.owner_labels("w", "s", "my-host")
    assert labels.owner_alive(own, host_name="my-host") is True


def test_labels_from_before_namespaces_are_judged_only_in_the_initial_namespace(monkeypatch) -> None:
    legacy = {
        k: v for k, v in labels.owner_labels("w", "s").items() if k not in (labels.OWNER_PIDNS, labels.OWNER_HOST)
    }
    legacy[labels.OWNER_START] = str(int(legacy[labels.OWNER_START]) + 1)  # a dead owner
    monkeypatch.setattr(labels, "pid_namespace", lambda: labels.INITIAL_PIDNS)
    assert labels.owner_alive(legacy) is False
    monkeypatch.setattr(labels, "pid_namespace", lambda: "pid:[4026532999]")  # a reaper inside a container
    assert labels.owner_alive(legacy) is None
