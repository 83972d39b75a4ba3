"""The task of each group the training workflow admits, pure: weighted round robin over the run's tasks, its
counts kept in the workflow's `TrainingState` (stdlib and `contracts` only; `Book.pick_task` asks it)."""

from __future__ import annotations

from trajflow.contracts.training import TrainingRunConfig, TrainingState


def pick(cfg: TrainingRunConfig, s: TrainingState, k: int) -> int:
    """Weighted round robin: the task whose share of the groups started so far lags its weight most (and
    counted as started) for the run's k-th group."""
    tasks = cfg.tasks
    if len(tasks) == 1:
        return 0
    total = sum(t.weight for t in tasks)
    # cumulative counts, kept in the state: counting only open groups let a lower-weight task starve,
    # since the closed groups of the heavier one no longer counted against it
    counts = s.task_groups + [0] * (len(tasks) - len(s.task_groups))
    task = max(range(len(tasks)), key=lambda i: tasks[i].weight / total * (k + 1) - counts[i])
    counts[task] += 1
    s.task_groups = counts
    return task
