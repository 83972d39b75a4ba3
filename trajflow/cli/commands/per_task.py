"""Per-task figures of a training run: the summary's `tasks` (reward and success by step, trajectories trained, the
held-out eval split by task), the progress views' per-task lines and the closing line's per-task part.

Pure (contracts in, contracts or text out). A task's figures come from the step records' `by_task` (a one-task
run's steps are that task's: `StepRecord.task_stats`), its totals from the run's `by_task`, and its eval from the
eval's per-seed rows. Not covered: trajectories a user started with the run's id count under "external" in the
totals of a run of several tasks, and are not listed per task.
"""

from __future__ import annotations

from trajflow.contracts.runs import EvalResult, TaskEval, TaskSummary
from trajflow.contracts.training import TaskStats, TrainingProgress, TrainingResult


def task_eval(ev: EvalResult | None, task: str) -> TaskEval | None:
    """`ev`'s greedy episodes of `task` (None when not evaluated, or no episode of it was kept per seed)."""
    if ev is None:
        return None
    rows = [r for r in ev.per_episode if r.task == task]
    if not rows:
        return None
    rewards = [r.greedy_reward for r in rows if r.greedy_reward is not None]
    wins = sum(r.greedy_win for r in rows)
    return TaskEval(
        episodes=len(rows),
        wins=wins,
        success_rate=wins / len(rows),
        mean_reward=sum(rewards) / len(rewards) if rewards else 0.0,
    )


def task_summaries(
    tasks: list[str], result: TrainingResult, before: EvalResult | None, after: EvalResult | None
) -> dict[str, TaskSummary]:
    """Task name -> its part of the run, for every task of the run (config order)."""
    steps = [record.task_stats(tasks) for record in result.history]
    out = {}
    for name in tasks:
        total = result.by_task.get(name, TaskStats())
        mine = [stats.get(name) for stats in steps]
        out[name] = TaskSummary(
            trajectories_trained=total.trajectories,
            wins=total.wins,
            reward_by_step=[round(s.reward_mean, 4) if s else None for s in mine],
            success_by_step=[round(s.success, 4) if s else None for s in mine],
            eval_before=task_eval(before, name),
            eval_after=task_eval(after, name),
        )
    return out


def _figures(stats: TaskStats | None) -> str:
    if stats is None or not stats.trajectories:
        return "-"
    return f"reward {stats.reward_mean:.3f} success {stats.wins}/{stats.trajectories}"


def task_lines(p: TrainingProgress, indent: str = "  ") -> list[str]:
    """One line per task, last step and so far, for a run of several tasks (none for a one-task run)."""
    if len(p.tasks) < 2:
        return []
    last = p.last.task_stats(p.tasks) if p.last else {}
    width = max(len(t) for t in p.tasks)
    return [
        f"{indent}{name:{width}}  last step: {_figures(last.get(name))}  so far: {_figures(p.by_task.get(name))}"
        for name in p.tasks
    ]


def task_verdict(tasks: dict[str, TaskSummary]) -> str:
    """The closing line's per-task part (a run of several tasks): held-out greedy wins before -> after per task,
    or trajectories trained and their wins when not evaluated; "" for a one-task run."""
    if len(tasks) < 2:
        return ""
    parts = []
    for name, t in tasks.items():
        before, after = t.eval_before, t.eval_after
        if before is not None and after is not None:
            parts.append(f"{name} {before.wins}/{before.episodes} -> {after.wins}/{after.episodes}")
        else:
            parts.append(f"{name} trained {t.trajectories_trained}, won {t.wins}")
    return "per task: " + ", ".join(parts)
