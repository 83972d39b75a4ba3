"""A simulated trainer for pipeline benchmarks and workflow tests: the trainer pool's `trainer.train_step`
activity (same name, same `TrainStepInput` / `TrainStepResult` as `trajflow.activities.trainer`) whose step is a sleep.

The TrainingWorkflow cannot tell it from the real one: a step sleeps for the run's step time, then records its
result and publishes version v+1 the way the real trainer does (`trajflow.infra.layout.step_key`, then the policy
pointer, with no weights: `weights: false`), so decode workers stamp turns with the new version and the staleness
bookkeeping works unchanged. A retried step whose version is already published returns the recorded result. A step
trains on the real trainer's list of refs (`trajflow.activities.batches.step_refs`: a sharded run's group manifests read
from the store, a missing one failing the step as it fails the real one), and returns their figures (`BatchStats.of`).

The step time is per run (`set_step_s`, before the run starts; `default_step_s` otherwise), since a benchmark
measures the sync generation phase first and derives the train time from it.
The result's metrics say where the step's time went: `load_s` (reading its refs: a sharded run's manifests from the
store) and `compute_s` (the sleep), beside `simulated: 1.0`.
Not covered: no model, no optimizer, no checkpoints, no trajectory record read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from trajflow.activities.batches import step_refs
from trajflow.contracts import names
from trajflow.contracts.shards import BatchStats
from trajflow.contracts.training import TrainStepInput, TrainStepResult
from trajflow.infra.layout import step_key
from trajflow.infra.policies import PolicyStore
from trajflow.infra.store import ObjectNotFound, ObjectStore


class SimulatedTrainerActivities:
    """The trainer activity of one simulated trainer pool."""

    def __init__(self, store: ObjectStore, policies: PolicyStore, default_step_s: float = 0.001) -> None:
        self.store = store
        self.policies = policies
        self.default_step_s = default_step_s
        self.step_s: dict[str, float] = {}
        """Seconds per step, by run id."""

    def set_step_s(self, run_id: str, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a step time must be >= 0, not {seconds}")
        self.step_s[run_id] = seconds

    @activity.defn(name=names.TRAIN_STEP)
    async def train_step(self, inp: TrainStepInput) -> TrainStepResult:
        version = inp.version + 1
        done = await asyncio.to_thread(self._recorded, inp.run_id, version)
        if done is not None:
            return done.model_copy(update={"resumed": True})
        if not inp.refs and not inp.groups:
            raise ApplicationError("a train step needs at least one trajectory", type=names.ERR_BAD_REQUEST)
        started = time.monotonic()
        refs = await asyncio.to_thread(step_refs, self.store, inp)
        loaded = time.monotonic()
        await asyncio.sleep(self.step_s.get(inp.run_id, self.default_step_s))
        result = TrainStepResult(
            version=version,
            weights_uri=None,
            metrics={"simulated": 1.0, "load_s": loaded - started, "compute_s": time.monotonic() - loaded},
            seconds=time.monotonic() - started,
            batch=BatchStats.of(refs, inp.version),
        )
        await asyncio.to_thread(self._publish, inp.run_id, result)
        return result

    def _recorded(self, run_id: str, version: int) -> TrainStepResult | None:
        if self.policies.latest_version(run_id, fresh=True) < version:
            return None
        try:
            return TrainStepResult.model_validate(self.store.get_json(self.store.uri_for(step_key(run_id, version))))
        except ObjectNotFound:
            return None

    def _publish(self, run_id: str, result: TrainStepResult) -> None:
        self.store.put_json(step_key(run_id, result.version), result)
        self.policies.publish(run_id, result.version, None)


def simulated_trainer_workers(
    client: Client, store: ObjectStore, pools: Sequence[str], cache_dir: Path, default_step_s: float = 0.001
) -> tuple[list[Worker], SimulatedTrainerActivities]:
    """Workers on the trainer queues of `pools`, one step at a time per pool as the real trainer worker takes
    them; and the activities, to set each run's step time."""
    acts = SimulatedTrainerActivities(store, PolicyStore(store, cache_dir), default_step_s)
    workers = [
        Worker(client, task_queue=names.trainer_queue(pool), activities=[acts.train_step], max_concurrent_activities=1)
        for pool in pools
    ]
    return workers, acts
