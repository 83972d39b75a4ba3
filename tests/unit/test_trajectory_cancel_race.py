"""A trajectory cancelled in the very workflow task that tells it its report failed (its training run was
terminated as it ended, and the run sweep cancelled it at once) ends, instead of failing every workflow task with
Temporal's "Invalid transition in state machine" and running for ever: the report's signal is shielded from the
cancel (workflows/trajectory.py, `_report`). The history was recorded from such a trajectory in a fresh-clone CI run
(tests/integration/test_run_lifecycle_cli.py), cut after its last workflow task started."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import LogForwardingConfig, LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.worker import Replayer

from trajflow.cli.replay.check import load_history
from trajflow.workflows.trajectory import TrajectoryWorkflow

HISTORY = Path(__file__).parent / "histories" / "trajectory-cancelled-as-it-reports.json"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


async def test_a_trajectory_cancelled_as_its_report_fails_ends_without_a_failed_task() -> None:
    core = logging.getLogger("test.trajectory_cancel_race.core")
    records = _Records()
    core.addHandler(records)
    core.setLevel(logging.DEBUG)
    runtime = Runtime(
        telemetry=TelemetryConfig(
            logging=LoggingConfig(
                filter=TelemetryFilter(core_level="WARN", other_level="WARN"),
                forwarding=LogForwardingConfig(logger=core),
            )
        )
    )
    replayer = Replayer(workflows=[TrajectoryWorkflow], data_converter=pydantic_data_converter, runtime=runtime)
    history = load_history(HISTORY)
    last = [EventType.Name(e.event_type) for e in history.events][-4:]
    assert last == [  # the report's signal failed (its run is gone), the cancel came, then the last task started
        "EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED",
        "EVENT_TYPE_WORKFLOW_TASK_SCHEDULED",
        "EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED",
        "EVENT_TYPE_WORKFLOW_TASK_STARTED",
    ]
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None
    await asyncio.sleep(1.5)  # core's logs reach Python in batches
    failed = [m for m in records.messages if "Failing workflow task" in m or "Nondeterminism" in m]
    assert failed == [], failed
