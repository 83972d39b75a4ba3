"""The soak's arithmetic (no Temporal): its loss audit and the workloads it refuses."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trajflow.lab.bench.soak import audit


def _result(steps: int, batch: int, **counters: int) -> SimpleNamespace:
    history = [SimpleNamespace(step=i, trajectories=batch) for i in range(1, steps + 1)]
    base = dict(started=0, completed=0, failed=0, infra_failed=0, cancelled=0, consumed=steps * batch)
    return SimpleNamespace(history=history, version=steps, counters=SimpleNamespace(**{**base, **counters}))


def test_the_soak_audit_adds_everything_up() -> None:
    ok = _result(3, 4, started=14, completed=13, cancelled=0)
    assert audit(ok, 3, 4, {"COMPLETED": 13, "RUNNING": 1}, running=1) == []
    lost = audit(ok, 3, 4, {"COMPLETED": 12, "RUNNING": 1}, running=1)
    assert lost and "visibility holds 13" in lost[0]
    unaccounted = audit(_result(3, 4, started=14, completed=12), 3, 4, {"COMPLETED": 13, "RUNNING": 1}, running=1)
    assert any("still running 1" in p for p in unaccounted)
    skipped = _result(3, 4, started=14, completed=13)
    skipped.history = [skipped.history[0], skipped.history[2]]
    assert any("not 1..3" in p for p in audit(skipped, 3, 4, {"COMPLETED": 13, "RUNNING": 1}, running=1))
    short_run = _result(3, 4, started=14, completed=13)
    short_run.version = 2
    assert any("ended at version 2" in p for p in audit(short_run, 3, 4, {"COMPLETED": 13, "RUNNING": 1}, running=1))
    long_run = _result(300, 4, started=1201, completed=1200)
    long_run.history = long_run.history[100:]  # a long run keeps the records of its last 200 steps
    assert audit(long_run, 300, 4, {"COMPLETED": 1200, "RUNNING": 1}, running=1) == []
    failed = audit(_result(3, 4, started=14, completed=12, infra_failed=1), 3, 4, {"COMPLETED": 14}, running=1)
    assert any("infra-failed" in p for p in failed)


def test_bad_workloads_are_refused() -> None:
    from trajflow.lab.bench.soak import SoakWorkload, quick_soak

    with pytest.raises(ValueError, match="0 steps"):
        SoakWorkload(steps=0)
    with pytest.raises(ValueError, match="whole groups"):
        SoakWorkload(batch_size=6, group_size=4)
    assert quick_soak().steps == 60 and quick_soak().history_events == 300
