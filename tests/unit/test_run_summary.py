"""`summary.json` and the eval result are models (`contracts.runs`): `trajflow train` writes them with the keys the
README lists, NaN metrics survive, and scripts/plot_runs.py and the plots read them back."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

from commands.plots import write_plots
from commands.train import summarise, verdict
from contracts.runs import EvalResult, RunSummary
from contracts.training import StepRecord, TrainingCounters, TrainingResult, TrainingRunConfig

REPO = Path(__file__).resolve().parents[2]
README_KEYS = {"eval_before", "eval_after", "steps", "trajectories_trained", "trajectories_dropped_stale", "wall_seconds",
               "counters", "reward_by_step", "time_by_step", "staleness_histogram", "last_metrics"}  # fmt: skip


def a_summary() -> RunSummary:
    history = [
        StepRecord(step=1, time_s=10.04, reward_mean=0.123456, trajectories=8, stale_dropped_total=0, staleness=[0, 1, 1]),
        StepRecord(step=2, time_s=20.0, reward_mean=0.5, trajectories=8, stale_dropped_total=0, staleness=[0],
                   metrics={"loss": math.nan, "clip_frac": 0.1}),
    ]  # fmt: skip
    result = TrainingResult(run_id="r", version=2, counters=TrainingCounters(completed=16, consumed=16), history=history,
                            wall_seconds=30.0)  # fmt: skip
    before = EvalResult(version=0, episodes=4, scored=4, not_completed=0, success_rate=0.25, mean_reward=0.25, seconds=1.0)
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
