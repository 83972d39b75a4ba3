"""What `trajflow train CONFIG` does: evaluate, train through the TrainingWorkflow with live progress (and, with
`[train.eval] every`, held-out evals during it: `trajflow.cli.commands.eval_curve`), evaluate again, then write a
JSON summary and plots to the run directory, beside the resolved run config (`config.json`: the
whole `RunConfig`, loadable with `RunConfig.model_validate_json`). The evaluation is `trajflow.cli.commands.evaluate`'s.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from temporalio.client import Client

from trajflow.cli.commands.eval_curve import EvalCurve, read_points, start_curve
from trajflow.cli.commands.evaluate import Say, evaluate, greedy_success
from trajflow.cli.commands.per_task import task_lines, task_summaries, task_verdict
from trajflow.cli.commands.plots import write_plots
from trajflow.client import start_training, training_progress
from trajflow.contracts.config import RunConfig
from trajflow.contracts.runs import CurvePoint, EvalResult, RunSummary
from trajflow.contracts.training import StepRecord, TrainingProgress, TrainingResult, TrainingRunConfig
from trajflow.infra.settings import Settings
from trajflow.observability.tracking.base import Fanout, eval_scalars, open_trackers, step_scalars

SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 24) -> str:
    """The last `width` values as block characters, scaled between their own min and max."""
    shown = values[-width:]
    if not shown:
        return ""
    low, high = min(shown), max(shown)
    if high == low:
        return SPARKS[3] * len(shown)
    return "".join(SPARKS[round((v - low) / (high - low) * (len(SPARKS) - 1))] for v in shown)


def progress_line(
    p: TrainingProgress, first_t: float, rewards: list[float] | None = None, step: StepRecord | None = None
) -> str:
    """One line of the live view; `rewards`: the batch reward of every step so far, drawn as a sparkline. `step`: the
    finished step the line is about (None: `p.last`, the newest); the counters are always the poll's."""
    c = p.counters
    rate = c.completed / p.elapsed_s if p.elapsed_s > 0 else 0.0
    shown = step or p.last
    reward = f"{shown.reward_mean:.3f}" if shown else "-"
    if rewards and len(rewards) > 1:
        reward += f" {sparkline(rewards)}"
    newest = shown is None or shown.step == p.version  # per-task lines describe the newest step only
    return (
        (
            f"[{time.monotonic() - first_t:6.0f}s] step {step.step if step else p.version}/{p.steps}  reward {reward}  "
            f"running {p.running}  buffered {p.buffered}  trained {c.consumed}  stale-dropped {c.dropped_stale}  "
            f"failed {c.failed}+{c.infra_failed} infra  {rate:.2f} traj/s"
            + (f"  flat-dropped {c.flat_groups_dropped}" if c.flat_groups_dropped else "")
        )
        + "".join(f"\n{line}" for line in (task_lines(p) if newest else []))
        + (f"\n  ADMISSION PAUSED: {p.paused}" if p.paused else "")
    )


class StepOrder:
    """The run's finished steps in version order, each once, from whatever the polls and the result carry: a poll
    may see several new steps at once (`TrainingProgress.recent`), or, from an older worker, only the newest
    (`last`). Never goes back: a step older than one already passed on is dropped (only possible when more steps
    than `PROGRESS_RECENT_STEPS` finished between two polls), so trackers get steps in increasing order."""

    def __init__(self) -> None:
        self.last = 0
        """The newest step passed on (versions start at 1)."""

    def new(self, records: Iterable[StepRecord]) -> list[StepRecord]:
        """Those of `records` newer than every step passed on so far, oldest first."""
        fresh = sorted({r.step: r for r in records if r.step > self.last}.values(), key=lambda r: r.step)
        if fresh:
            self.last = fresh[-1].step
        return fresh


def _local_autocast(setting: str) -> str:
    """The trainer's precision as this host would choose it (the trainer worker logs its own choice)."""
    import torch

    from trajflow.rl.precision import autocast_precision

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return f"{autocast_precision(setting, device).describe()} (on this host)"


async def train(
    config: RunConfig,
    settings: Settings,
    client: Client,
    run_id: str,
    run_dir: Path,
    say: Say,
    *,
    skip_eval: bool = False,
) -> RunSummary:
    run = config.training_run()
    run_dir.mkdir(parents=True, exist_ok=True)
    # the whole run config as it ran (command-line overrides applied, every default filled in): the record of a run
    (run_dir / "config.json").write_text(config.model_dump_json(indent=2))
    say(
        f"run {run_id}: {run.steps} steps of B={run.batch_size} (groups of {run.group_size}+{run.redundancy}), "
        f"alpha={run.alpha}{' sync' if run.sync else ''}, loss {run.trainer.loss.kind}, lr {run.trainer.lr:g}"
    )
    say(f"trainer autocast {run.trainer.autocast}: {_local_autocast(run.trainer.autocast)}")
    trackers = open_trackers(config.tracking, run_dir, run_id, say)  # a missing package fails before the run
    if trackers.names:
        say(f"tracking: {', '.join(trackers.names)} (TensorBoard: tensorboard --logdir {run_dir.parent})")
    trackers.config(config.model_dump(mode="json"))
    evaluate_now = not skip_eval and run.eval.episodes > 0
    before = await evaluate(client, run, say, policy=run_id, version=0) if evaluate_now else None
    if before is not None:
        trackers.scalars(0, eval_scalars(before))
        # for `trajflow attach`, which may write this run's summary when this process is gone
        (run_dir / EVAL_BEFORE).write_text(before.model_dump_json(indent=2))
    # before the run starts: the curve holds its due versions ahead, so none is pruned before it is seen
    curve = start_curve(client, settings, run, run_id, run_dir, trackers, say) if evaluate_now else None
    t0 = time.monotonic()
    try:
        handle = await start_training(run, run_id=run_id, client=client)
    except BaseException:
        if curve is not None:
            curve.release_unreached()  # e.g. a run of that id exists: its versions are not this curve's to hold
        raise
    ui_host = settings.temporal_address.rsplit(":", 1)[0]
    ui = f"http://{ui_host}:{settings.temporal_ui_port}/namespaces/{settings.temporal_namespace}/workflows/{run_id}"
    say(f"training workflow {run_id} started (Temporal UI: {ui})")
    result = await follow_run(handle, say, on_step=on_steps(StepLog(trackers).log, curve))
    wall = time.monotonic() - t0
    return await finish(client, run, run_id, run_dir, result, wall, before, trackers, say, evaluate_now, curve)


def on_steps(log: Callable[[StepRecord], None], curve: EvalCurve | None) -> Callable[[StepRecord], None]:
    """What each finished step does: `log` it, and tell the curve (when there is one) its version is out."""

    def on_step(record: StepRecord) -> None:
        log(record)
        if curve is not None:
            curve.seen(record.step)

    return on_step


EVAL_BEFORE = "eval_before.json"
"""The run directory's record of the evaluation before training (written by `train`, read by `attach`)."""


async def finish(
    client: Client,
    run: TrainingRunConfig,
    run_id: str,
    run_dir: Path,
    result: TrainingResult,
    wall: float,
    before: EvalResult | None,
    trackers: Fanout,
    say: Say,
    evaluate_now: bool,
    curve: EvalCurve | None = None,
) -> RunSummary:
    """After the run ended: the evaluation after it (when `evaluate_now`), the evals during training still in flight
    or queued (`curve`; without one, those recorded in the run directory), then summary.json and the plots."""
    if result.stopped:
        say(f"run {run_id} stopped early: {result.stopped}")
    if curve is not None:
        curve.ended(result.version)  # the steps that finished after the last poll, below the last
    after = await evaluate(client, run, say, policy=run_id, version=result.version) if evaluate_now else None
    if after is not None:
        trackers.scalars(result.version, eval_scalars(after))
    points = await curve.close(before, after) if curve is not None else read_points(run_dir)
    trackers.close()
    summary = summarise(run, run_id, result, wall, before, after, points)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").write_text(summary.model_dump_json(indent=2))
    plots = write_plots(summary, run_dir)
    say(f"summary: {run_dir / 'summary.json'}; plots: {', '.join(str(p) for p in plots)}")
    return summary


class StepLog:
    """Each step's scalars to the trackers once (the live polls and the final history both report steps)."""

    def __init__(self, trackers: Fanout) -> None:
        self.trackers = trackers
        self.logged: dict[int, StepRecord] = {}

    def log(self, record: StepRecord) -> None:
        if record.step in self.logged:
            return
        self.trackers.scalars(record.step, step_scalars(record, self.logged.get(record.step - 1)))
        self.logged[record.step] = record


class RunEnded(RuntimeError):
    """The run ended without a result: terminated, cancelled, failed or timed out."""


async def follow_run(
    handle, say: Say, give_up_after_s: float = 600.0, on_step: Callable[[StepRecord], None] | None = None
) -> TrainingResult:
    """Print a line per finished step, in version order, and a heartbeat line every 20 s until the run ends;
    `on_step` gets each finished step once, in version order (`StepOrder`): from the polls' recent steps, and at
    the end from the result's history (the steps that finished after the last poll).

    Polls (describe + the progress query) instead of holding one long call open; the client retries calls
    while the Temporal server restarts, and other errors are reported and retried, so the command rides out
    a restart of the stack: the run itself is durable, only this view pauses.
    """
    from temporalio.client import WorkflowExecutionStatus

    first = time.monotonic()
    last_line, unreachable_since, total = 0.0, None, None
    rewards: dict[int, float] = {}
    order = StepOrder()

    def finished(record: StepRecord) -> None:
        rewards[record.step] = record.reward_mean
        if on_step is not None:
            on_step(record)

    while True:
        try:
            status = (await handle.describe()).status
            if status not in (WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.COMPLETED):
                raise RunEnded(f"training run {handle.id} ended {status.name if status else '?'}: no result")
            if status is not WorkflowExecutionStatus.RUNNING:
                result: TrainingResult = await handle.result()
                for record in order.new(result.history):  # the steps that finished after the last poll
                    finished(record)
                    say(
                        f"[{time.monotonic() - first:6.0f}s] step {record.step}/{total or result.version}  reward "
                        f"{record.reward_mean:.3f}  trajectories {record.trajectories} (from the run's result)"
                    )
                c = result.counters
                say(
                    f"[{time.monotonic() - first:6.0f}s] finished: step {result.version}, trained {c.consumed}, "
                    f"stale-dropped {c.dropped_stale}, failed {c.failed}+{c.infra_failed} infra"
                    + (f", flat groups dropped {c.flat_groups_dropped}" if c.flat_groups_dropped else "")
                )
                return result
            p = await training_progress(handle)
            unreachable_since = None
        except RunEnded:
            raise
        except Exception as e:  # server restarting, workers down, between runs of continue-as-new
            now = time.monotonic()
            if unreachable_since is None:
                unreachable_since = now
                say(f"(progress unavailable: {type(e).__name__}: {str(e)[:120]}; the run continues, retrying)")
            elif now - unreachable_since > give_up_after_s:
                raise
            await asyncio.sleep(2.0)
            continue
        total = p.steps
        fresh = order.new(p.recent or ([p.last] if p.last is not None else []))
        for record in fresh:
            finished(record)
            say(progress_line(p, first, [rewards[k] for k in sorted(rewards) if k <= record.step], step=record))
        if fresh:
            last_line = time.monotonic()
        elif time.monotonic() - last_line > 20:
            say(progress_line(p, first, [rewards[k] for k in sorted(rewards)]))
            last_line = time.monotonic()
        await asyncio.sleep(2.0)


def summarise(
    run: TrainingRunConfig,
    run_id: str,
    result: TrainingResult,
    wall: float,
    before: EvalResult | None,
    after: EvalResult | None,
    curve: list[CurvePoint] | None = None,
) -> RunSummary:
    c = result.counters
    staleness: Counter[int] = Counter()
    for step in result.history:
        staleness.update(step.staleness)
    return RunSummary(
        run_id=run_id,
        eval_before=before,
        eval_after=after,
        steps=result.version,
        trajectories_trained=c.consumed,
        trajectories_dropped_stale=c.dropped_stale,
        flat_groups_dropped=c.flat_groups_dropped,
        flat_groups_dropped_by_step=[s.flat_groups_dropped for s in result.history],
        wall_seconds=round(wall, 1),
        trajectories_per_s=round(c.completed / wall, 3) if wall > 0 else 0.0,
        alpha=run.alpha,
        sync=run.sync,
        batch_size=run.batch_size,
        group_size=run.group_size,
        loss=run.trainer.loss.kind,
        counters=c,
        staleness_histogram={str(k): staleness[k] for k in sorted(staleness)},
        reward_by_step=[round(s.reward_mean, 4) for s in result.history],
        time_by_step=[round(s.time_s, 1) for s in result.history],
        last_metrics=result.history[-1].metrics if result.history else {},
        tasks=task_summaries([t.name for t in run.tasks], result, before, after),
        stopped=result.stopped,
        eval_curve=curve or [],
    )


VERDICT_CURVE_POINTS = 40
"""The verdict's sparkline of held-out success by step shows at most the last this many points."""


def verdict(summary: RunSummary, plot: Path) -> str:
    """The run in one line for the end of `trajflow train`: held-out greedy success and mean reward before and
    after (when evaluated), the held-out success by step as a sparkline (with `[train.eval] every`), steps,
    training wall time, and where the plot is."""
    minutes = summary.wall_seconds / 60
    head = f"run {summary.run_id}: {summary.steps} steps in {minutes:.1f} min of training"
    before, after = summary.eval_before, summary.eval_after
    per_task = task_verdict(summary.tasks)
    per_task = f"; {per_task}" if per_task else ""
    if before is None or after is None:
        return f"{head} (not evaluated){per_task}; plot: {plot}"
    curve = summary.eval_curve[-VERDICT_CURVE_POINTS:]
    by_step = (
        f", by step {''.join(SPARKS[round(p.rate * (len(SPARKS) - 1))] for p in curve)} "  # on 0..1, not min..max
        f"(v{curve[0].version}..v{curve[-1].version} on {curve[0].episodes} seeds)"
        if len(curve) > 2
        else ""
    )
    return (
        f"{head}; held-out greedy success {greedy_success(before)} -> {greedy_success(after)}{by_step}, "
        f"mean reward {before.mean_reward:.3f} -> {after.mean_reward:.3f}{per_task}; plot: {plot}"
    )
