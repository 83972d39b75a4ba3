"""What the training workflow's queries answer, built from its state (pure: no Temporal here), so that their size
can be measured without a server (trajflow.lab.bench.state_size, docs/capacity.md)."""

from __future__ import annotations

from trajflow.contracts.training import PROGRESS_RECENT_STEPS, TrainingProgress, TrainingRunConfig, TrainingState


def progress(cfg: TrainingRunConfig, s: TrainingState, elapsed_s: float) -> TrainingProgress:
    """The `progress` query's answer: counters, the last PROGRESS_RECENT_STEPS step records, per-task totals."""
    return TrainingProgress(
        run_id=s.run_id,
        version=s.version,
        steps=cfg.steps,
        alpha=cfg.alpha,
        running=sum(len(g.running) for g in s.groups.values()),
        buffered=sum(len(g.completed) for g in s.groups.values()),
        counters=s.counters,
        last=s.history[-1] if s.history else None,
        recent=s.history[-PROGRESS_RECENT_STEPS:],
        elapsed_s=elapsed_s,
        paused=s.paused,
        tasks=[t.name for t in cfg.tasks],
        by_task=s.by_task,
        stopping=f"{s.stopping.reason}; ends at v{s.stopping.at_version}" if s.stopping else None,
    )
