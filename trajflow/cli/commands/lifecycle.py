"""What `trajflow attach RUN` and `trajflow stop RUN` do: follow a training run from any process (the live view,
then the evaluation after it and the summary, as `trajflow train` would have), and end one early.

The run's config comes from the workflow itself (its `run_config` query), the evaluation before training from the
run directory when `trajflow train` recorded it there (`eval_before.json`). An attached view logs to no tracker:
the process that started the run owned them.
"""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.client import Client, WorkflowExecutionStatus

from trajflow.cli.commands.eval_curve import start_curve
from trajflow.cli.commands.evaluate import Say
from trajflow.cli.commands.train import EVAL_BEFORE, finish, follow_run, on_steps
from trajflow.client import attach_training, stop_training
from trajflow.contracts import names
from trajflow.contracts.runs import EvalResult, RunSummary
from trajflow.contracts.training import TrainingRunConfig
from trajflow.infra.settings import Settings
from trajflow.infra.temporal import execution_status
from trajflow.observability.tracking.base import Fanout


async def is_running(client: Client, run_id: str) -> bool:
    """True when a training run of that id is running now."""
    return await execution_status(client, run_id) is WorkflowExecutionStatus.RUNNING


def eval_before(run_dir: Path) -> EvalResult | None:
    """The evaluation `trajflow train` ran before training, if it recorded one in the run directory."""
    path = run_dir / EVAL_BEFORE
    return EvalResult.model_validate_json(path.read_text()) if path.is_file() else None


async def attach(
    client: Client,
    run_id: str,
    run_dir: Path,
    say: Say,
    *,
    skip_eval: bool = False,
    settings: Settings | None = None,
) -> RunSummary:
    """Follow run `run_id` to its end (LookupError for an unknown one; `RunEnded` for one that ends without a
    result), then evaluate the final policy and write the summary and plots, as `trajflow train` does. With
    `settings` (the store's), the evals during training (`[train.eval] every`) go on where the run directory's
    record ends (`eval_curve`). A run that has ended and has its summary already: that summary, unchanged."""
    handle = await attach_training(run_id, client=client)
    written = run_dir / "summary.json"
    if (await handle.describe()).status is not WorkflowExecutionStatus.RUNNING and written.is_file():
        say(f"run {run_id} has ended; its summary: {written}")
        return RunSummary.model_validate_json(written.read_text())
    run = await handle.query(names.QUERY_RUN_CONFIG, result_type=TrainingRunConfig)
    say(f"attached to training run {run_id}: {run.steps} steps of B={run.batch_size}, alpha={run.alpha}")
    evaluate_now = not skip_eval and run.eval.episodes > 0
    trackers = Fanout([], say)
    curve = start_curve(client, settings, run, run_id, run_dir, trackers, say) if evaluate_now and settings else None
    result = await follow_run(handle, say, on_step=on_steps(lambda _: None, curve))
    before = eval_before(run_dir)
    return await finish(
        client, run, run_id, run_dir, result, result.wall_seconds, before, trackers, say, evaluate_now, curve
    )


async def stop(
    client: Client, run_id: str, run_dir: Path, say: Say, *, now: bool, reason: str, wait: bool
) -> dict[str, object]:
    """Send the stop; with `wait`, follow the run to its end and write its summary when none is there yet (a
    `trajflow train` still attached writes its own, with the evaluation after). What happened, as a dict."""
    handle = await stop_training(run_id, now=now, reason=reason, client=client)
    say(f"stop sent to run {run_id} ({'now' if now else 'graceful'}): {reason}")
    out: dict[str, object] = {"run_id": run_id, "now": now, "reason": reason}
    if not wait:
        return out
    run = await handle.query(names.QUERY_RUN_CONFIG, result_type=TrainingRunConfig)
    result = await follow_run(handle, say)
    out.update(version=result.version, steps=run.steps, stopped=result.stopped, counters=result.counters.model_dump())
    if not (run_dir / "summary.json").exists():
        summary = await finish(
            client, run, run_id, run_dir, result, result.wall_seconds, eval_before(run_dir), Fanout([], say), say, False
        )
        out["summary"] = str(run_dir / "summary.json")
        out["stopped"] = summary.stopped
    return out


def dumps(out: dict[str, object]) -> str:
    return json.dumps(out, indent=2, default=str)
