"""A shard that started its members the way the code before `shard-start-batches` did (all 512 in its first workflow
task) replays on today's code: the batched start is behind `workflow.patched`, so a worker upgraded under a live run
(or a query replaying a closed shard) follows the path the history took. Without the patch the replay fails with the
non-determinism error that stalled 19 of the 32 shards of a B = 8,192 soak whose worker re-imported the changed
workflow code mid-run (2026-11-26). The history is that soak's shard `soaks-deedfb-s001216`, cut after its 6th
workflow task started, with the member starts' inputs and options left out (the replay compares ids and types)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from trajflow.cli.replay.check import load_history
from trajflow.workflows.shard import ShardWorkflow

HISTORY = Path(__file__).parent / "histories" / "shard-started-its-members-at-once.json"


async def test_a_shard_of_the_code_before_start_batches_replays() -> None:
    history = load_history(HISTORY)
    kinds = [EventType.Name(e.event_type) for e in history.events]
    before_second_task = kinds[: kinds.index("EVENT_TYPE_WORKFLOW_TASK_STARTED", 3)]
    assert Counter(before_second_task)["EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED"] == 512  # all at once
    replayer = Replayer(workflows=[ShardWorkflow], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
