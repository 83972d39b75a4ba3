"""`trajflow bench real`'s CPU accounting (trajflow/lab/bench/cpu_use.py): /proc parsing, process groups summed,
cores per process between two snapshots, with "other" and "idle", and run-queue waits; and on this machine's real
/proc, a busy child process shows up as about one core of its group, and two pinned to one CPU each wait half."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trajflow.lab.bench import cpu_use
from trajflow.lab.bench.cpu_use import Snapshot, cores_used, cores_waiting, machine_seconds, stat_fields

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int, comm: str, pgrp: int, utime: int, stime: int) -> str:
    # fields: pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
    return f"{pid} ({comm}) S 1 {pgrp} {pgrp} 0 -1 4194560 10 0 0 0 {utime} {stime} 0 0 20 0 1 0 100\n"


def test_stat_fields_count_from_the_last_parenthesis() -> None:
    assert stat_fields(_stat(42, "python) (x y", 40, 300, 100)) == (40, pytest.approx(400 / TICKS))


def test_machine_seconds_count_idle_and_iowait_as_not_busy() -> None:
    busy, total = machine_seconds("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    assert (busy, total) == (pytest.approx(150 / TICKS), pytest.approx(1000 / TICKS))


def test_take_sums_each_process_group(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu  100 0 100 800 0 0 0 0 0 0\n")
    for pid, pgrp, ut in [(10, 10, 200), (11, 10, 100), (20, 20, 50), (30, 30, 999)]:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(_stat(pid, "w", pgrp, ut, 0))
        for tid, wait_ns in [(pid, 1_500_000_000), (pid + 100, 500_000_000)]:  # two threads each
            (tmp_path / str(pid) / "task" / str(tid)).mkdir(parents=True)
            (tmp_path / str(pid) / "task" / str(tid) / "schedstat").write_text(f"999 {wait_ns} 7\n")
    (tmp_path / "self").mkdir()  # not a pid: skipped
    snap = cpu_use.take({"decode": 10, "trainer": 20, "gone": 99}, proc=tmp_path)
    assert snap.groups == {
        "decode": pytest.approx(300 / TICKS),
        "trainer": pytest.approx(50 / TICKS),
        "gone": 0.0,
    }
    assert (snap.busy_s, snap.total_s) == (pytest.approx(200 / TICKS), pytest.approx(1000 / TICKS))
    assert snap.waits == {"decode": pytest.approx(4.0), "trainer": pytest.approx(2.0), "gone": 0.0}


def test_cores_used_per_group_with_other_and_idle() -> None:
    before = Snapshot(at=0.0, groups={"decode": 10.0, "trainer": 5.0, "env": 100.0}, busy_s=500.0, total_s=1000.0)
    # 10 s on 2 CPUs: 20 CPU-seconds, 18 busy; decode 9, trainer 7, env restarted and used 1 since
    after = Snapshot(at=10.0, groups={"decode": 19.0, "trainer": 12.0, "env": 1.0}, busy_s=518.0, total_s=1020.0)
    used = cores_used(before, after)
    assert used == {
        "decode": pytest.approx(0.9),
        "trainer": pytest.approx(0.7),
        "env": pytest.approx(0.1),
        "other": pytest.approx(0.1),
        "idle": pytest.approx(0.2),
    }
    assert cores_used(after, after) == {}


def test_cores_waiting_is_the_wait_over_the_wall_time() -> None:
    before = Snapshot(at=0.0, waits={"decode": 1.0, "trainer": 2.0})
    after = Snapshot(at=10.0, waits={"decode": 3.0, "trainer": 2.5, "new": 9.0})
    assert cores_waiting(before, after) == {"decode": pytest.approx(0.2), "trainer": pytest.approx(0.05)}
    assert cores_waiting(after, after) == {}


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux /proc")
def test_a_busy_process_group_shows_as_one_core() -> None:
    spin = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 2.5: pass\n"
    child = subprocess.Popen([sys.executable, "-c", spin], start_new_session=True)
    try:
        time.sleep(0.3)
        before = cpu_use.take({"spinner": child.pid})
        time.sleep(1.5)
        used = cores_used(before, cpu_use.take({"spinner": child.pid}))
    finally:
        child.wait()
    assert 0.6 < used["spinner"] <= 1.05  # one thread spinning: about one core (less on a loaded machine)
    assert set(used) == {"spinner", "other", "idle"}


@pytest.mark.skipif(not Path("/proc/self/schedstat").exists(), reason="needs a kernel with scheduler statistics")
def test_two_spinners_on_one_cpu_each_wait_about_half_the_time() -> None:
    spin = "import os, time\nos.sched_setaffinity(0, {0})\nt = time.monotonic()\nwhile time.monotonic() - t < 3: pass\n"
    a, b = (subprocess.Popen([sys.executable, "-c", spin], start_new_session=True) for _ in range(2))
    try:
        time.sleep(0.5)
        before = cpu_use.take({"a": a.pid, "b": b.pid})
        time.sleep(1.5)
        waiting = cores_waiting(before, cpu_use.take({"a": a.pid, "b": b.pid}))
    finally:
        a.wait()
        b.wait()
    # one CPU for two: each waits about half the time (more where something else also runs on CPU 0)
    assert 0.3 < waiting["a"] < 0.9 and 0.3 < waiting["b"] < 0.9
    assert 0.8 < waiting["a"] + waiting["b"] < 1.7
