"""The plots `trajflow train` writes beside a run's `summary.json`, drawn from that summary alone (so a summary read
back draws the same plots): reward.png (training batch reward against step and wall time, the held-out reward
before and after, the held-out greedy success by step when the run evaluated during training; per task too in a
run of several tasks, with their success) and staleness.png (how stale the trained samples were).

Figures are built by `*_figure` (returned open, for tests to look at their lines and legends) and saved and
closed by `write_plots`. matplotlib's Agg backend: no display needed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from trajflow.contracts.runs import RunSummary

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _gaps(values: list[float | None]) -> list[float]:
    """None (a step without that task) as NaN: a gap in the line."""
    return [math.nan if v is None else v for v in values]


def reward_figure(summary: RunSummary) -> Figure:
    """Mean training batch reward against optimizer step and against wall time, with the held-out mean reward
    before and after training as lines on the first. A run of several tasks adds one line per task (its
    trajectories' mean reward in each batch) beside the batch mean, and a third panel: each task's success (wins
    over its trajectories) by step."""
    plt = _pyplot()
    # the history keeps the last steps of a long run (workflows.bookkeeping.HISTORY_KEPT): they end at `steps`
    steps = list(range(summary.steps - len(summary.reward_by_step) + 1, summary.steps + 1))
    times = [t / 60 for t in summary.time_by_step]
    tasks = summary.tasks if len(summary.tasks) > 1 else {}
    fig, axes = plt.subplots(1, 3 if tasks else 2, figsize=(16 if tasks else 11, 4))
    ax1, ax2 = axes[0], axes[1]
    overall = "training batch mean reward" + (" (all tasks)" if tasks else "")
    for ax, xs, label in ((ax1, steps, "optimizer step"), (ax2, times, "wall time (min)")):
        ax.plot(xs, summary.reward_by_step, marker="o", ms=3, color="k", label=overall)
        for name, task in tasks.items():
            ax.plot(xs, _gaps(task.reward_by_step), marker=".", ms=3, lw=1, label=f"{name} mean reward")
        ax.set_xlabel(label)
        ax.set_ylabel("reward")
        ax.grid(alpha=0.3)
    if tasks:
        ax3 = axes[2]
        for name, task in tasks.items():
            ax3.plot(steps, _gaps(task.success_by_step), marker=".", ms=3, lw=1, label=f"{name} success")
        ax3.set_xlabel("optimizer step")
        ax3.set_ylabel("success (wins / trajectories)")
        ax3.set_ylim(-0.05, 1.05)
        ax3.grid(alpha=0.3)
        ax3.legend(fontsize=8)
        ax2.legend(fontsize=8)
    for ev, color in ((summary.eval_before, "r"), (summary.eval_after, "g")):
        if ev:
            ax1.axhline(ev.mean_reward, color=color, ls="--", label=f"held-out mean reward v{ev.version}")
    if summary.eval_curve:  # on the reward axis: a success rate is in [0, 1] too
        curve = summary.eval_curve
        label = f"held-out greedy success ({curve[0].episodes} seeds)"
        ax1.plot([p.version for p in curve], [p.rate for p in curve], marker="s", ms=4, color="b", label=label)
        ax1.set_ylabel("reward; success")
    ax1.legend(fontsize=8)
    fig.suptitle("trajflow training run")
    fig.tight_layout()
    return fig


def staleness_figure(summary: RunSummary) -> Figure:
    """How many trained samples were how stale (trainer version - sample version)."""
    plt = _pyplot()
    hist = {int(k): v for k, v in summary.staleness_histogram.items()}
    fig, ax = plt.subplots(figsize=(5, 3.5))
    if hist:
        ax.bar(list(hist), list(hist.values()), width=0.8)
    ax.set_xlabel("staleness (trainer version - sample version)")
    ax.set_ylabel("trajectories trained")
    ax.set_title("staleness of trained samples")
    fig.tight_layout()
    return fig


def write_plots(summary: RunSummary, run_dir: Path) -> list[Path]:
    """reward.png and staleness.png in `run_dir`; their paths."""
    plt = _pyplot()
    out = []
    for name, fig in (("reward.png", reward_figure(summary)), ("staleness.png", staleness_figure(summary))):
        path = run_dir / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        out.append(path)
    return out
