"""The trainer replicated over the processes of `accelerate launch` (or torchrun): rank 0 leads, the others follow.

The leader (rank 0) is the only rank that talks to Temporal and the store. For each step it sends every other
rank a `StepOrder` (`torch.distributed.broadcast_object_list`: the whole batch, the trainer config, the paths
to write), and then every rank runs the same `execute`: (re)build the trainer when the order says so (from the
model, or from a checkpoint directory the leader downloaded), `PolicyTrainer.train_step` on its shard of the
batch (DDP all-reduces the gradients; the loss is divided by the whole batch's token or sequence count, so N
ranks make one process's update), `save_checkpoint` and `export_weights` (both hold barriers, so every rank takes
part; only rank 0 writes the files). Followers loop on `follow()` until a `Stop`; while idle the leader sends a
`KeepAlive` now and then (`keepalive`), so a follower's wait never reaches the process group's timeout and a dead
rank is noticed between steps too.

A single process (no launcher) is a group of one: `lead` runs the order here and makes no collective call, so
the trainer behaves exactly as it did before this module existed.

Failures: a rank that dies breaks the group (gloo raises on the others at once). In a group of more than one,
any failed step is treated as a broken group (`RankGroupBroken`): ranks may be out of step (one raised while the
others wait in a collective), so the group is never used again; the leader's process exits and the launcher
(`--max_restarts`) restarts every rank, and the retried step rebuilds the trainer from the store's checkpoint.
Restarted ranks reuse the launcher's rendezvous store, so each attempt joins the group under its own key prefix
(`join_launched_group`); without it the new ranks read the dead ones' addresses and fail to connect.

Limits: the ranks of one trainer share a filesystem (checkpoints are written into, and restored from, the
leader's work dir): one host, or a shared work dir. Replicated weights only (DDP; no FSDP/DeepSpeed). Every rank
receives the whole batch and takes its shard. A rank that hangs (rather than dies) is noticed only at the process
group's timeout. Multi-GPU (NCCL) is the same code path but has not been run here (no GPUs).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from trajflow.contracts.training import TrainerConfig
from trajflow.rl.samples import TrainSample

if TYPE_CHECKING:
    from trajflow.rl.trainer import PolicyTrainer

log = logging.getLogger("trajflow.trainer.ranks")

KEEPALIVE_EVERY_S = 60.0
"""How often an idle leader pings the followers: far below the process group's default 30 min timeout."""


@dataclass(frozen=True)
class StepOrder:
    """One optimizer step, as every rank runs it."""

    run_id: str
    version: int
    """The trainer's version before the step."""
    config: TrainerConfig
    samples: list[TrainSample]
    """The whole batch; each rank trains on `samples[rank::world]`."""
    rebuild: bool
    """Build the trainer anew before the step (a new run, or the leader's trainer is not at `version`)."""
    restore_from: Path | None
    """With `rebuild`: the checkpoint directory of `version` to load (None: the initial model, version 0)."""
    checkpoint_dir: Path
    export_dir: Path
    export_dtype: str


@dataclass(frozen=True)
class KeepAlive:
    """Nothing to do; wait for the next message."""


@dataclass(frozen=True)
class Stop:
    """The leader is shutting down: followers return from `follow`."""


Message = StepOrder | KeepAlive | Stop


class RankGroupBroken(RuntimeError):
    """A step or a message failed in a group of several ranks: a rank died, or the ranks are out of step. The
    group cannot be used again; every rank must restart."""


def launched() -> bool:
    """True when this process is one of several started by a launcher (WORLD_SIZE > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def join_launched_group() -> None:
    """Join this launch attempt's process group (gloo on CPU, NCCL on CUDA); nothing for a single process.

    The rendezvous store of torchrun (which `accelerate launch --multi_gpu` runs) outlives a restart of the ranks,
    so the group is created under a prefix naming the attempt (`TORCHELASTIC_RESTART_COUNT`). Call before building
    any `accelerate` object: accelerate then uses this group instead of creating its own."""
    if not launched() or dist.is_initialized():
        return
    from torch.distributed.rendezvous import rendezvous

    store, rank, world = next(rendezvous("env://"))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    backend = "gloo"
    if torch.cuda.is_available():
        backend = "nccl"
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    prefix = f"trajflow/attempt-{attempt}"
    prefixed = dist.PrefixStore(prefix, store)  # pyright: ignore[reportPrivateImportUsage]  # public in torch's docs
    dist.init_process_group(backend, store=prefixed, rank=rank, world_size=world)
    log.info("rank %d of %d joined (%s, launch attempt %s, pid %d)", rank, world, backend, attempt, os.getpid())


class TrainerRanks:
    """This process's share of the replicated trainer: its rank, and the `PolicyTrainer` it holds."""

    def __init__(self, model_path: Path, device: str = "auto") -> None:
        """`device`: where this rank computes (`trajflow.rl.devices`; under a launched group on GPUs `auto`/`cuda` is
        the rank's own GPU, which the launch made current)."""
        self.model_path = Path(model_path)
        self.device = device
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.run_id: str | None = None
        self.trainer: PolicyTrainer | None = None
        self.broken = False

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def holds(self, run_id: str, version: int) -> bool:
        """Whether this rank's trainer is `run_id`'s at `version` (the leader's test for `StepOrder.rebuild`)."""
        return self.trainer is not None and self.run_id == run_id and self.trainer.version == version

    def lead(self, order: StepOrder) -> dict[str, float]:
        """Leader only: send `order` to every other rank and run it here; the step's metrics."""
        self._send(order)
        try:
            return self.execute(order)
        except Exception as e:
            if self.world == 1:
                raise
            self.broken = True
            raise RankGroupBroken(f"step v{order.version} failed in a group of {self.world} ranks: {e}") from e

    def keepalive(self) -> None:
        """Leader only, while idle: ping the followers (fails with RankGroupBroken if one is gone)."""
        self._send(KeepAlive())

    def stop(self) -> None:
        """Leader only: let the followers return from `follow`."""
        self._send(Stop())

    def follow(self) -> None:
        """Follower (rank > 0) only: run every order the leader sends, until it sends Stop. A failed step or
        message raises: the process must exit, so the launcher restarts the group."""
        if self.is_leader:
            raise RuntimeError("rank 0 leads; only ranks > 0 follow")
        while True:
            box: list[Message | None] = [None]
            dist.broadcast_object_list(box, src=0)
            message = box[0]
            if isinstance(message, Stop):
                log.info("rank %d: stop", self.rank)
                return
            if isinstance(message, StepOrder):
                log.info("rank %d: step v%d of run %s received", self.rank, message.version, message.run_id)
                self.execute(message)
                log.info("rank %d: step v%d of run %s done", self.rank, message.version, message.run_id)

    def execute(self, order: StepOrder) -> dict[str, float]:
        """What every rank does for one step: (re)build, train on its shard, checkpoint, export."""
        from trajflow.rl.trainer import PolicyTrainer

        if order.rebuild or self.trainer is None:
            self.trainer = None
            trainer = PolicyTrainer(self.model_path, order.config, device=self.device)
            if order.restore_from is not None:
                trainer.load_checkpoint(order.restore_from)
            if trainer.version != order.version:
                raise ValueError(
                    f"the trainer for {order.run_id} is at v{trainer.version}, the step is v{order.version}"
                )
            self.run_id, self.trainer = order.run_id, trainer
        trainer = self.trainer
        try:
            metrics = trainer.train_step(order.samples, order.config)
            trainer.save_checkpoint(order.checkpoint_dir)
            trainer.export_weights(order.export_dir, dtype=order.export_dtype)
        except BaseException:
            self.trainer = None  # half a step may have been applied: the next order rebuilds
            raise
        return metrics

    def _send(self, message: Message) -> None:
        if not self.is_leader:
            raise RuntimeError(f"rank {self.rank} follows; only rank 0 sends")
        if self.world == 1:
            return
        if self.broken:
            raise RankGroupBroken("the trainer's rank group is broken; this process must restart")
        try:
            dist.broadcast_object_list([message], src=0)
        except Exception as e:
            self.broken = True
            raise RankGroupBroken(f"could not reach the other {self.world - 1} trainer ranks: {e}") from e
