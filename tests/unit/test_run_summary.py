"""`summary.json` and the eval result are models (`trajflow.contracts.runs`): `trajflow train` writes them with the keys
the training guide (docs/training.md) lists, NaN metrics survive, and scripts/plot_runs.py and the plots read them
back."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

from trajflow.cli.commands.plots import write_plots
from trajflow.cli.commands.train import summarise, verdict
from trajflow.contracts.runs import EpisodeEval, EvalResult, RunSummary
from trajflow.contracts.tasks import TaskConfig
from trajflow.contracts.training import (
    StepRecord,
    TaskStats,
    TrainingCounters,
    TrainingProgress,
    TrainingResult,
    TrainingRunConfig,
)
from trajflow.contracts.trajectory import TrajectoryStatus

REPO = Path(__file__).resolve().parents[2]
README_KEYS = {
    "eval_before",
    "eval_after",
    "steps",
    "trajectories_trained",
    "trajectories_dropped_stale",
    "wall_seconds",
    "counters",
    "reward_by_step",
    "time_by_step",
    "staleness_histogram",
    "last_metrics",
    "tasks",
}


def a_summary() -> RunSummary:
    history = [
        StepRecord(
            step=1, time_s=10.04, reward_mean=0.123456, trajectories=8, stale_dropped_total=0, staleness={0: 1, 1: 2}
        ),
        StepRecord.model_validate(  # a record of an older worker: every sample's lag
            {
                "step": 2,
                "time_s": 20.0,
                "reward_mean": 0.5,
                "trajectories": 8,
                "stale_dropped_total": 0,
                "staleness": [0],
                "metrics": {"loss": math.nan, "clip_frac": 0.1},
            }
        ),  # fmt: skip
    ]
    result = TrainingResult(
        run_id="r", version=2, counters=TrainingCounters(completed=16, consumed=16), history=history, wall_seconds=30.0
    )
    before = EvalResult(
        version=0, episodes=4, scored=4, not_completed=0, success_rate=0.25, mean_reward=0.25, seconds=1.0
    )
    after = before.model_copy(update={"version": 2, "success_rate": 0.5, "mean_reward": 0.5})
    return summarise(TrainingRunConfig(), "r", result, 32.0, before, after)


def test_the_summary_has_the_readme_keys_and_reads_back(tmp_path: Path) -> None:
    summary = a_summary()
    text = summary.model_dump_json(indent=2)
    data = json.loads(text)  # Python's parser reads the NaN of a diverged step
    assert README_KEYS <= data.keys()
    assert data["eval_after"]["version"] == 2 and data["staleness_histogram"] == {"0": 2, "1": 2}
    assert data["reward_by_step"] == [0.1235, 0.5] and data["time_by_step"] == [10.0, 20.0]
    assert data["trajectories_per_s"] == 0.5 and data["counters"]["consumed"] == 16
    back = RunSummary.model_validate_json(text)
    assert math.isnan(back.last_metrics["loss"])
    assert back.model_dump(exclude={"last_metrics"}) == summary.model_dump(exclude={"last_metrics"})


def test_plot_runs_and_the_run_plots_read_the_summary(tmp_path: Path) -> None:
    summary = a_summary()
    path = tmp_path / "summary.json"
    path.write_text(summary.model_dump_json(indent=2))
    spec = importlib.util.spec_from_file_location("plot_runs", REPO / "scripts" / "plot_runs.py")
    assert spec is not None and spec.loader is not None
    plot_runs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot_runs)
    out = tmp_path / "runs.png"
    assert plot_runs.main(["plot_runs.py", str(out), f"α=1={path}"]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    pngs = write_plots(summary, tmp_path)
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs)


def test_the_closing_line_gives_before_after_and_the_plot() -> None:
    summary = a_summary()
    line = verdict(summary, Path("runs/r/reward.png"))
    assert line == (
        "run r: 2 steps in 0.5 min of training; held-out greedy success 1/4 (25%) -> 2/4 (50%), "
        "mean reward 0.250 -> 0.500; plot: runs/r/reward.png"
    )
    unevaluated = summary.model_copy(update={"eval_before": None, "eval_after": None})
    assert verdict(unevaluated, Path("p.png")) == "run r: 2 steps in 0.5 min of training (not evaluated); plot: p.png"


TASKS = ["game", "shell", "data"]


def a_three_task_summary() -> RunSummary:
    """Two steps of a 2:1:1 run; the second step's batch has no shell trajectory."""

    def stats(n: int, reward: float, wins: int) -> TaskStats:
        return TaskStats(trajectories=n, reward_mean=reward, wins=wins)

    history = [
        StepRecord(step=1, time_s=10.0, reward_mean=0.5, trajectories=8, stale_dropped_total=0, wins=3,
                   by_task={"game": stats(4, 0.75, 3), "shell": stats(2, 0.0, 0), "data": stats(2, 0.5, 0)}),
        StepRecord(step=2, time_s=20.0, reward_mean=0.625, trajectories=8, stale_dropped_total=0, wins=5,
                   by_task={"game": stats(6, 0.5, 3), "data": stats(2, 1.0, 2)}),
    ]  # fmt: skip
    result = TrainingResult(
        run_id="r", version=2, counters=TrainingCounters(completed=16, consumed=16), history=history, wall_seconds=30.0,
        by_task={"game": stats(10, 0.6, 6), "shell": stats(2, 0.0, 0), "data": stats(4, 0.75, 2)},
    )  # fmt: skip

    def row(i: int, reward: float | None, win: bool) -> EpisodeEval:
        status = TrajectoryStatus.COMPLETED if reward is not None else TrajectoryStatus.INFRA_FAILED
        return EpisodeEval(seed=100 + i, task=TASKS[i % 3], greedy_status=status, greedy_reward=reward, greedy_win=win)

    before = EvalResult(
        version=0,
        episodes=6,
        scored=5,
        not_completed=1,
        success_rate=1 / 6,
        mean_reward=0.3,
        seconds=1.0,
        per_episode=[
            row(0, 1.0, True),
            row(1, 0.0, False),
            row(2, 0.0, False),
            row(3, 0.5, False),
            row(4, None, False),
            row(5, 0.0, False),
        ],
    )
    after = before.model_copy(update={"version": 2, "per_episode": [row(i, 1.0, True) for i in range(6)]})
    run = TrainingRunConfig(tasks=[TaskConfig(name=n) for n in TASKS], steps=2)
    return summarise(run, "r", result, 32.0, before, after)


def test_a_three_task_summary_splits_reward_success_and_eval_by_task() -> None:
    summary = RunSummary.model_validate_json(a_three_task_summary().model_dump_json())  # and reads back
    t = summary.tasks
    assert list(t) == TASKS
    assert t["game"].reward_by_step == [0.75, 0.5] and t["game"].success_by_step == [0.75, 0.5]
    assert t["shell"].reward_by_step == [0.0, None] and t["shell"].success_by_step == [0.0, None]
    assert t["data"].success_by_step == [0.0, 1.0]
    assert [t[n].trajectories_trained for n in TASKS] == [10, 2, 4] and t["game"].wins == 6
    assert sum(x.trajectories_trained for x in t.values()) == summary.trajectories_trained == 16
    game, shell = t["game"].eval_before, t["shell"].eval_before
    assert game is not None and shell is not None
    assert (game.episodes, game.wins, game.mean_reward) == (2, 1, 0.75)  # seeds 0 and 3
    assert (shell.episodes, shell.wins, shell.mean_reward) == (2, 0, 0.0)  # seed 4 not scored: a loss, no reward
    assert all(x.eval_after is not None and x.eval_after.success_rate == 1.0 for x in t.values())
    line = verdict(summary, Path("p.png"))
    assert "; per task: game 1/2 -> 2/2, shell 0/2 -> 2/2, data 0/2 -> 2/2; plot: p.png" in line


def test_a_one_task_summary_has_that_task_from_the_steps_own_figures() -> None:
    summary = a_summary()
    (name,) = summary.tasks
    assert summary.tasks[name].reward_by_step == summary.reward_by_step
    assert "per task" not in verdict(summary, Path("p.png"))


def test_the_reward_plot_of_three_tasks_draws_a_line_per_task_and_the_batch_mean(tmp_path: Path) -> None:
    from trajflow.cli.commands.plots import reward_figure

    summary = a_three_task_summary()
    fig = reward_figure(summary)
    by_step, by_time, success = fig.axes
    labels = [line.get_label() for line in by_step.get_lines()]
    assert labels[:4] == ["training batch mean reward (all tasks)", "game mean reward", "shell mean reward",
                          "data mean reward"]  # fmt: skip
    legend = by_step.get_legend()
    assert legend is not None and [text.get_text() for text in legend.get_texts()][:4] == labels[:4]
    assert "held-out mean reward v0" in labels and "held-out mean reward v2" in labels
    shell = by_step.get_lines()[2]
    xs, ys = [float(x) for x in shell.get_xdata()], [float(y) for y in shell.get_ydata()]  # type: ignore[union-attr]
    assert xs == [1, 2] and ys[0] == 0.0 and math.isnan(ys[1])
    assert [line.get_label() for line in by_time.get_lines()][1:4] == labels[1:4]
    assert [line.get_label() for line in success.get_lines()] == ["game success", "shell success", "data success"]
    assert [float(y) for y in success.get_lines()[2].get_ydata()] == [0.0, 1.0]  # type: ignore[union-attr]
    pngs = write_plots(summary, tmp_path)
    assert pngs[0] == tmp_path / "reward.png" and pngs[0].read_bytes()[:4] == b"\x89PNG"
    one_task = reward_figure(a_summary())
    assert len(one_task.axes) == 2 and [ln.get_label() for ln in one_task.axes[0].get_lines()][0] == (
        "training batch mean reward"
    )


def test_the_progress_views_show_each_task_of_a_run_of_several() -> None:
    from trajflow.cli.commands.live import format_status
    from trajflow.cli.commands.train import progress_line

    p = TrainingProgress(run_id="r", version=2, steps=4, alpha=1, running=3, buffered=0,
                         counters=TrainingCounters(consumed=16), last=None, elapsed_s=20.0, tasks=TASKS)  # fmt: skip
    so_far = {"game": TaskStats(trajectories=10, reward_mean=0.6, wins=6), "shell": TaskStats(trajectories=2)}
    last = StepRecord(step=2, time_s=20.0, reward_mean=0.625, trajectories=8, stale_dropped_total=0,
                      by_task={"game": TaskStats(trajectories=6, reward_mean=0.5, wins=3)})  # fmt: skip
    p = p.model_copy(update={"by_task": so_far, "last": last})
    lines = progress_line(p, 0.0).splitlines()
    assert lines[1:] == [
        "  game   last step: reward 0.500 success 3/6  so far: reward 0.600 success 6/10",
        "  shell  last step: -  so far: reward 0.000 success 0/2",
        "  data   last step: -  so far: -",
    ]
    status = {
        "kind": "training",
        "workflow_id": "r",
        "execution_status": "running",
        "attributes": {},
        "query_error": None,
        "progress": p.model_dump(mode="json"),
        "trajectories_query": "q",
        "trajectories": [],
    }
    text = format_status(status)
    assert "per task (trajectories trained, their mean reward and wins):\n  game   last step: reward 0.500" in text
    one = p.model_copy(update={"tasks": ["game"], "by_task": {}})
    assert len(progress_line(one, 0.0).splitlines()) == 1
    assert "per task" not in format_status({**status, "progress": one.model_dump(mode="json")})
