"""Plot several `trajflow train` runs side by side: training reward against step and against wall time.

Usage: python scripts/plot_runs.py OUT.png LABEL=RUN_DIR/summary.json [LABEL=... ...]

Each summary is the `summary.json` that `trajflow train` writes; the held-out mean reward after training is
marked at each run's last step. Limits: needs matplotlib (a project dependency) and trajflow importable (the
project's venv, or PYTHONPATH=.: the summaries are read as `trajflow.contracts.runs.RunSummary`); reads only the
summaries.
"""

from __future__ import annotations

import sys
from pathlib import Path

from trajflow.contracts.runs import RunSummary


def main(argv: list[str]) -> int:
    if len(argv) < 3 or any("=" not in a for a in argv[2:]):
        print(__doc__, file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for arg in argv[2:]:
        label, _, path = arg.rpartition("=")  # the label may hold "=" (α=1), the path may not
        summary = RunSummary.model_validate_json(Path(path).read_text())
        rewards = summary.reward_by_step
        steps = list(range(1, len(rewards) + 1))
        minutes = [t / 60 for t in summary.time_by_step]
        after = summary.eval_after.mean_reward if summary.eval_after else None
        for ax, xs in ((by_step, steps), (by_time, minutes)):
            (line,) = ax.plot(xs, rewards, marker="o", ms=3, label=f"{label}: training batch")
            if after is not None:
                ax.plot(
                    [xs[-1]],
                    [after],
                    marker="*",
                    ms=12,
                    color=line.get_color(),
                    ls="none",
                    label=f"{label}: held-out after ({after:.2f})",
                )
    by_step.set_xlabel("optimizer step")
    by_time.set_xlabel("wall time (min)")
    for ax in (by_step, by_time):
        ax.set_ylabel("mean reward")
        ax.grid(alpha=0.3)
    by_step.legend(fontsize=8)
    fig.suptitle("trajflow training runs")
    fig.tight_layout()
    fig.savefig(argv[1], dpi=100)
    print(f"wrote {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
