"""The α bound of a training run, in one place for direct and sharded runs: how many groups may start now, and
which samples are too stale to train on. Pure (stdlib and `contracts`), like the books that ask it
(`trajflow.workflows.bookkeeping.Book`, `trajflow.workflows.fanin.ShardBook`)."""

from __future__ import annotations

from trajflow.contracts.training import TrainingRunConfig, TrainingState


def groups_to_admit(
    cfg: TrainingRunConfig, s: TrainingState, *, open_groups: int, training: bool, pause_admission: bool = False
) -> int:
    """Admission control: at most (v + α + 1)·B − (consumed + running) samples started, in whole groups.

    `open_groups` are the run's own groups admitted and not yet trained on, dropped or abandoned (in flight, or
    finished and waiting); `running` counts n samples for each, so with consumed = v·B the bound keeps (α + 1)·B
    useful samples in the pipeline. Redundant extras come on top. None while admission is paused (but for a
    probe: one), stopping, at the last step, or, in sync mode, while a step is trained."""
    if pause_admission or s.stopping is not None or s.version >= cfg.steps or (s.paused and not s.probe):
        return 0
    if cfg.sync and training:
        return 0  # the barrier: the next batch starts only after this one is trained
    running = cfg.group_size * open_groups
    budget = (s.version + cfg.alpha + 1) * cfg.batch_size - (s.counters.consumed + running)
    # never start more than the run can still use (a batch being trained is already consumed)
    remaining = cfg.steps * cfg.batch_size - s.counters.consumed - running
    groups = max(0, min(budget, remaining) // cfg.group_size)
    if cfg.sync:
        # one batch at a time: its groups, less those still open. A group of it that was abandoned (members failed
        # past max_group_restarts) is so replaced by a new one (a new seed) for the same batch; waiting for none to
        # be open would leave the batch one group short forever.
        groups = min(groups, cfg.batch_size // cfg.group_size - open_groups)
    return min(groups, 1) if s.paused else groups


def staleness_floor(cfg: TrainingRunConfig, s: TrainingState) -> int:
    """The oldest policy version a sample may come from and still be trained on at the current version (the hard
    bound: v − α)."""
    return s.version - cfg.alpha


def is_stale(cfg: TrainingRunConfig, s: TrainingState, oldest_version: int) -> bool:
    return oldest_version < staleness_floor(cfg, s)
