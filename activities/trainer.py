"""Trainer activity: one optimizer step of one run, on the trainer pool (stateful: the worker keeps the model and
optimizer in memory between steps and reloads them from the store's checkpoint when it has to).

A step is idempotent: its result is recorded in the store before the new version is published, and a retried
step whose version is already published returns that record instead of training again. A step issued again while
this worker still trains it (its workflow continued as new mid-step and issued it anew) waits for that one. Per step it
writes, in this order: the trainer checkpoint (model + optimizer + version) of version v+1, the step record, then the
policy weights of v+1 and the `latest` pointer decode workers follow. Old checkpoints and versions are pruned.

The step trains on its refs (`trajflow.activities.batches.step_refs`: those of the input, then those of a sharded run's
group manifests in the store, a missing one failing the step without retry), loads their trajectory records
(`RECORD_READS` at a time) and turns them into training samples with `trajflow.rl.samples.samples_from_records`
(advantages from the groups and rewards the workflow recorded in the refs); a batch holding an unscored or token-less
trajectory fails without retry (`ERR_BAD_REQUEST`). Its result carries the batch's figures (`BatchStats.of`), and so
does the record a retried step reads back.

Under `accelerate launch` this activity runs on rank 0 only: each step goes to every rank as an
`trajflow.rl.distributed.StepOrder` and is trained by all of them (`TrainerRanks.lead`); rank 0 alone writes to the
store. A step that breaks the rank group fails with `ERR_TRAINER_RANKS` (retried) and `on_broken` is called, so the
worker stops and the launcher restarts every rank; `keep_followers` pings idle ranks, `release_followers` lets
them exit. A single process is a group of one and trains exactly as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from temporalio import activity
from temporalio.exceptions import ApplicationError

from trajflow.activities.batches import load_records, step_refs
from trajflow.activities.heartbeats import with_heartbeats
from trajflow.contracts import metrics, names
from trajflow.contracts.shards import BatchStats
from trajflow.contracts.training import TrainStepInput, TrainStepResult
from trajflow.infra.layout import checkpoint_prefix, manifest_key, policy_version_prefix, step_key
from trajflow.infra.policies import PolicyStore, delete_prefix, get_dir, put_dir
from trajflow.infra.policies import safe_name as _safe
from trajflow.infra.store import ObjectNotFound, ObjectStore
from trajflow.observability.metrics import record

if TYPE_CHECKING:
    from trajflow.rl.distributed import TrainerRanks

HEARTBEAT_EVERY_S = 5.0
"""Below a fifth of the heartbeat timeout in workflows/stubs.py."""
CHECKPOINTS_KEPT = 2
log = logging.getLogger("trajflow.trainer")


class TrainerActivities:
    def __init__(
        self,
        store: ObjectStore,
        policies: PolicyStore,
        model_path: Path,
        work_dir: Path,
        export_dtype: str = "float32",
        ranks: TrainerRanks | None = None,
        on_broken: Callable[[], None] | None = None,
        device: str = "auto",
    ) -> None:
        """`export_dtype`: the dtype published weights are written in, the decode workers' choice
        (`trajflow.rl.engines.load.decode_precision`); they cast on load, so another dtype still works, at a cost in
        bytes (float32) or precision (bfloat16). `ranks`: the launched rank group this process leads (None: this
        process alone, built on the first step, computing on `device`: a setting, `trajflow.rl.devices`). `on_broken`:
        called (on the event loop) when a step broke the rank group."""
        self.store = store
        self.policies = policies
        self.model_path = Path(model_path)
        self.export_dtype = export_dtype
        self.device = device
        self.work_dir = Path(work_dir)
        self._ranks = ranks
        self._on_broken = on_broken
        # One thread: steps never overlap, and torch state stays on one thread.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer")
        self._steps: dict[tuple[str, int], asyncio.Future[TrainStepResult]] = {}
        """Steps in progress by (run, version): an attempt of a step already running here waits for it."""

    @activity.defn(name=names.TRAIN_STEP)
    async def train_step(self, inp: TrainStepInput) -> TrainStepResult:
        key = (inp.run_id, inp.version)
        step = self._steps.get(key)
        if step is None:
            step = self._steps[key] = asyncio.ensure_future(self._step(inp))
            step.add_done_callback(lambda done: self._forget(key, done))
        # shielded: an attempt cancelled (its workflow run ended) leaves the step to the attempt issued next
        return await with_heartbeats(asyncio.shield(step), f"training v{inp.version + 1}", HEARTBEAT_EVERY_S)

    def _forget(self, key: tuple[str, int], step: asyncio.Future[TrainStepResult]) -> None:
        self._steps.pop(key, None)
        if not step.cancelled() and step.exception() is not None:
            # reported to the attempt that awaits it; when none does (cancelled by a worker shutdown), logged here
            log.warning("train step v%d of run %s failed: %s", key[1] + 1, key[0], step.exception())

    async def _step(self, inp: TrainStepInput) -> TrainStepResult:
        done = await asyncio.to_thread(self._recorded, inp.run_id, inp.version + 1)
        if done is not None:
            return done.model_copy(update={"resumed": True})
        if not inp.refs and not inp.groups:
            raise ApplicationError("a train step needs at least one trajectory", type=names.ERR_BAD_REQUEST)
        from trajflow.rl.distributed import RankGroupBroken

        try:
            result = await asyncio.get_running_loop().run_in_executor(self._executor, self._train, inp)
            meter = activity.metric_meter()
            record(meter, metrics.TRAIN_STEP_SECONDS, result.seconds, run=inp.run_id)
            for lag, count in (result.batch.staleness if result.batch else {}).items():
                for _ in range(count):  # one observation per sample trained on, as the histogram counts them
                    record(meter, metrics.SAMPLE_STALENESS, lag, run=inp.run_id)
            return result
        except RankGroupBroken as e:
            if self._on_broken is not None:
                self._on_broken()
            raise ApplicationError(str(e), type=names.ERR_TRAINER_RANKS) from e

    @property
    def ranks(self) -> TrainerRanks:
        if self._ranks is None:
            from trajflow.rl.distributed import TrainerRanks

            self._ranks = TrainerRanks(self.model_path, self.device)
        return self._ranks

    async def keep_followers(self, every_s: float) -> None:
        """Ping the other ranks every `every_s` seconds between steps (on the training thread, so pings and steps
        never interleave), until cancelled or the group breaks."""
        from trajflow.rl.distributed import RankGroupBroken

        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(every_s)
            try:
                await loop.run_in_executor(self._executor, self.ranks.keepalive)
            except RankGroupBroken:
                log.error("the trainer's other ranks are gone")
                if self._on_broken is not None:
                    self._on_broken()
                return

    async def release_followers(self) -> None:
        """Tell the other ranks to exit (after the Temporal worker stopped); nothing if the group is broken."""
        from trajflow.rl.distributed import RankGroupBroken

        if self.ranks.broken:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self.ranks.stop)
        except RankGroupBroken:
            pass  # they are gone already: nothing to release

    def _recorded(self, run_id: str, version: int) -> TrainStepResult | None:
        """The result of a step already taken and published, if any."""
        if self.policies.latest_version(run_id, fresh=True) < version:
            return None
        try:
            return TrainStepResult.model_validate(self.store.get_json(self.store.uri_for(step_key(run_id, version))))
        except ObjectNotFound:
            return None

    def _train(self, inp: TrainStepInput) -> TrainStepResult:
        from trajflow.rl.distributed import StepOrder
        from trajflow.rl.samples import samples_from_records

        started = time.monotonic()
        refs = step_refs(self.store, inp)
        records = load_records(self.store, [r.trajectory_uri for r in refs])
        load_s = time.monotonic() - started  # the step's reads from the store (manifests, then records)
        try:
            samples = samples_from_records(
                records, normalize_std=inp.trainer.normalize_adv_std, refs=refs, credit=inp.trainer.credit
            )
        except ValueError as e:  # an unscored or token-less trajectory: retrying cannot fix the batch
            raise ApplicationError(str(e), type=names.ERR_BAD_REQUEST, non_retryable=True) from e
        ranks = self.ranks
        version = inp.version + 1
        run_dir = self.work_dir / _safe(inp.run_id)
        rebuild = not ranks.holds(inp.run_id, inp.version)
        order = StepOrder(
            run_id=inp.run_id,
            version=inp.version,
            config=inp.trainer,
            samples=samples,
            rebuild=rebuild,
            restore_from=self._restore_dir(inp) if rebuild and inp.version > 0 else None,
            checkpoint_dir=run_dir / f"ckpt-v{version:06d}",
            export_dir=run_dir / f"weights-v{version:06d}",
            export_dtype=self.export_dtype,
        )
        metrics = ranks.lead(order)
        if rebuild and ranks.trainer is not None:
            activity.logger.info(
                "trainer for run %s on %d rank(s), from v%d: autocast %s",
                inp.run_id,
                ranks.world,
                inp.version,
                ranks.trainer.autocast.describe(),
            )
        put_dir(self.store, checkpoint_prefix(inp.run_id, version), order.checkpoint_dir)
        result = TrainStepResult(
            version=version,
            weights_uri=self.store.uri_for(manifest_key(policy_version_prefix(inp.run_id, version))),
            metrics={**{k: float(v) for k, v in metrics.items()}, "load_s": load_s},
            seconds=time.monotonic() - started,
            batch=BatchStats.of(refs, inp.version),
        )
        self._publish(inp.run_id, result, order.export_dir)
        self._cleanup(inp.run_id, version)
        return result

    def _publish(self, run_id: str, result: TrainStepResult, export_dir: Path | None) -> None:
        self.store.put_json(step_key(run_id, result.version), result)
        self.policies.publish(run_id, result.version, export_dir)

    def _restore_dir(self, inp: TrainStepInput) -> Path:
        """The store's trainer checkpoint at `inp.version`, downloaded into the work dir (every rank reads it)."""
        local = self.work_dir / _safe(inp.run_id) / f"restore-v{inp.version:06d}"
        try:
            get_dir(self.store, checkpoint_prefix(inp.run_id, inp.version), local)
        except ObjectNotFound:
            raise ApplicationError(
                f"run {inp.run_id!r} has no trainer checkpoint at v{inp.version} to resume from",
                type=names.ERR_BAD_REQUEST,
            ) from None
        activity.logger.info("resuming run %s at v%d from the store", inp.run_id, inp.version)
        return local

    def _cleanup(self, run_id: str, version: int) -> None:
        import shutil

        old = version - CHECKPOINTS_KEPT
        if old >= 1:
            delete_prefix(self.store, checkpoint_prefix(run_id, old) + "/")
        self.policies.prune(run_id, keep=CHECKPOINTS_KEPT)
        for path in (self.work_dir / _safe(run_id)).glob("*-v*"):
            if path.name.rsplit("-v", 1)[-1].isdigit() and int(path.name.rsplit("-v", 1)[-1]) < version:
                shutil.rmtree(path, ignore_errors=True)
