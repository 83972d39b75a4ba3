"""What the training workflow's queries answer, built from its state (pure: no Temporal here), so that their size
can be measured without a server (trajflow.lab.bench.state_size, docs/capacity.md)."""

from __future__ import annotations

from trajflow.contracts.training import PROGRESS_RECENT_STEPS, TrainingProgress, TrainingRunConfig, TrainingState


def progress(cfg: TrainingRunConfig, s: TrainingState, elapsed_s: float) -> TrainingProgress:
    """The `progress` query's answer: counters, the last PROGRESS_RECENT_STEPS step records, per-task totals. In a
    sharded run the training workflow knows groups, not trajectories: `running` counts n a group still open and
    `buffered` n a complete group waiting to be trained on."""
    sharded_running = sharded_buffered = 0
    if s.sharded is not None:
        sharded_running = cfg.group_size * len(s.sharded.open)
        sharded_buffered = cfg.group_size * sum(len(v) for v in s.sharded.ready.values())
    return TrainingProgress(
        run_id=s.run_id,
        version=s.version,
        steps=cfg.steps,
        alpha=cfg.alpha,
        running=sum(len(g.running) for g in s.groups.values()) + sharded_running,
        buffered=sum(len(g.completed) for g in s.groups.values()) + sharded_buffered,
        counters=s.counters,
        last=s.history[-1] if s.history else None,
        recent=s.history[-PROGRESS_RECENT_STEPS:],
        elapsed_s=elapsed_s,
        paused=s.paused,
        tasks=[t.name for t in cfg.tasks],
        by_task=s.by_task,
        stopping=f"{s.stopping.reason}; ends at v{s.stopping.at_version}" if s.stopping else None,
    )
