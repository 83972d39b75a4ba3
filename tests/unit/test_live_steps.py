"""`trajflow train`'s live view (`trajflow.cli.commands.train.follow_run`) against made-up progress snapshots: every
finished step is printed and passed on once, in version order, whether a poll sees several new steps at once, only
the newest (a worker older than `TrainingProgress.recent`), or none before the run ends (the result's history)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus

from trajflow.cli.commands import train
from trajflow.cli.commands.train import StepOrder, follow_run
from trajflow.contracts.training import StepRecord, TrainingCounters, TrainingProgress, TrainingResult


def record(step: int) -> StepRecord:
    return StepRecord(step=step, time_s=float(step), reward_mean=step / 10, trajectories=8, stale_dropped_total=0)


def snapshot(recent: list[int], last: int | None = None) -> TrainingProgress:
    """A poll's answer: `recent` the step records it carries; `last` alone (recent empty) as an older worker's."""
    newest = last if last is not None else (recent[-1] if recent else None)
    return TrainingProgress(
        run_id="r", version=newest or 0, steps=4, alpha=1, running=2, buffered=0, counters=TrainingCounters(),
        last=record(newest) if newest else None, recent=[record(s) for s in recent], elapsed_s=1.0,
    )  # fmt: skip


@dataclass
class FakeHandle:
    """A TrainingWorkflow handle that answers `polls` in turn, then reports the run finished with `history`."""

    polls: list[TrainingProgress]
    history: list[int]
    asked: int = 0

    async def describe(self) -> Any:
        done = self.asked >= len(self.polls)
        return type("D", (), {"status": WorkflowExecutionStatus.COMPLETED if done else WorkflowExecutionStatus.RUNNING})

    async def query(self, name: str, result_type: type) -> TrainingProgress:
        self.asked += 1
        return self.polls[self.asked - 1]

    async def result(self) -> TrainingResult:
        steps = [record(s) for s in self.history]
        return TrainingResult(run_id="r", version=self.history[-1], counters=TrainingCounters(), history=steps,
                              wall_seconds=1.0)  # fmt: skip


async def followed(handle: FakeHandle, monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[str]]:
    async def no_wait(_: float) -> None:
        return None

    monkeypatch.setattr(train.asyncio, "sleep", no_wait)
    passed: list[int] = []
    lines: list[str] = []
    await follow_run(handle, lines.append, on_step=lambda r: passed.append(r.step))
    return passed, [line for line in lines if "] step " in line]


@pytest.mark.parametrize(
    ("polls", "history", "expected"),
    [
        # several steps finish between two polls: each is printed, oldest first
        ([snapshot([]), snapshot([1]), snapshot([1, 2, 3])], [1, 2, 3, 4], [1, 2, 3, 4]),
        # a poll sees a later step before an earlier one (an older worker's `last` only): never going back
        ([snapshot([], last=2), snapshot([1, 2, 3])], [1, 2, 3, 4], [2, 3, 4]),
        # no poll saw a step: all come from the result's history, in order
        ([snapshot([])], [1, 2, 3], [1, 2, 3]),
        # the same snapshot twice: nothing printed twice
        ([snapshot([1, 2]), snapshot([1, 2]), snapshot([1, 2, 3, 4])], [1, 2, 3, 4], [1, 2, 3, 4]),
    ],
)
async def test_steps_are_printed_once_each_in_version_order(
    polls: list[TrainingProgress], history: list[int], expected: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    passed, lines = await followed(FakeHandle(polls, history), monkeypatch)
    assert passed == expected
    shown = [int(line.split("] step ")[1].split("/")[0]) for line in lines]
    assert [s for s in shown if s > 0] == expected  # step 0: the first poll's heartbeat, before any step
    step_lines = [line for line in lines if "step 0/" not in line]
    assert all(f"reward {s / 10:.3f}" in line for s, line in zip(expected, step_lines, strict=True))


def test_step_order_passes_on_newer_steps_only() -> None:
    order = StepOrder()
    assert [r.step for r in order.new([record(2)])] == [2]
    assert [r.step for r in order.new([record(3), record(1), record(2)])] == [3]
    assert order.new([record(3)]) == [] and order.last == 3
