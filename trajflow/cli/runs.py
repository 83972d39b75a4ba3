"""The CLI's run commands: `rollout` (one trajectory), `demo` (a handful), `train` (a training run with evals),
`attach` and `stop` (follow or end a run started elsewhere), `eval` (held-out evaluation of a policy version) and
`chaos` (training under injected faults, then an audit).
Heavy imports happen inside each command."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from trajflow.cli.common import DEFAULT_CONFIG, ConfigOpt, app, config_file
from trajflow.cli.common import check_tools as _check_tools
from trajflow.cli.common import check_trainable as _check_trainable
from trajflow.cli.common import exit_now as _exit
from trajflow.cli.common import load_config as _config
from trajflow.cli.common import publish_envs as _publish_envs
from trajflow.cli.common import published as _published
from trajflow.cli.common import say as _say

T = TypeVar("T")

if TYPE_CHECKING:
    from trajflow.contracts.config import RunConfig
    from trajflow.contracts.runs import RunSummary
    from trajflow.contracts.trajectory import TrajectoryRequest


@app.command()
def rollout(
    env: Annotated[
        str | None,
        typer.Option(
            help="Env id: game:, rg:, shell:, gym:, py:MODULE:CLASS, agent:MODULE:FUNCTION, agent-cmd:FILE or "
            "data:NAME (default: the first task's)."
        ),
    ] = None,
    env_path: Annotated[
        Path | None,
        typer.Option(
            help="A py: env's or agent:/agent-cmd: program's source directory (its module or command, "
            "requirements.txt); a data: task's file."
        ),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Environment seed (default: --request's, else 0).")] = None,
    task: Annotated[str | None, typer.Option(help="Task name from the config.")] = None,
    max_turns: Annotated[int | None, typer.Option(help="Turn limit.")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature (0: greedy).")] = None,
    request: Annotated[
        str | None,
        typer.Option(
            help="TrajectoryRequest fields as one JSON object, over the task's (e.g. '{\"seed\": 3}'); the options "
            "above win."
        ),
    ] = None,
    workflow_id: Annotated[str | None, typer.Option(help="Workflow id (default: generated).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON only.")] = False,
    config: ConfigOpt = DEFAULT_CONFIG,
) -> None:
    """Run one trajectory on the stack and print its transcript, reward, status and timing."""
    from trajflow.cli.commands.rollout import request_from_config, run_and_report

    run_config = _config(config)
    try:
        req = request_from_config(run_config, task, env, seed, max_turns, temperature, request)
    except ValueError as e:  # bad input: say what to fix, exit 2 before touching the stack
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None
    req = _publish_request(req, run_config, task, env, env_path)
    _exit(asyncio.run(run_and_report(req, workflow_id, as_json)))


def _publish_request(
    req: TrajectoryRequest, config: RunConfig, task: str | None, env: str | None, env_path: Path | None
) -> TrajectoryRequest:
    """`req` with its `py:`/`agent:`/`agent-cmd:`/`data:` env packaged: from --env-path, else (the config's own env)
    the task's env_path."""
    from trajflow.sandbox.user.submit import packaged, publish_request

    if env is None:  # the config's own task: refused here if it passes tools the model cannot render
        _check_tools(config, [next(t for t in config.tasks if task is None or t.name == task)])
    if not packaged(req.env_id) and env_path is None:
        return req
    if env_path is not None:
        path = str(env_path)
    elif env is not None:  # another env than the task's: its source must be named
        path = ""
    else:
        path = next(t for t in config.tasks if task is None or t.name == task).env_path
    return _published(lambda store, wheel_cache: publish_request(req, path, store, wheel_cache, _say))


@app.command()
def train(
    config_path: Annotated[
        Path,
        typer.Argument(
            metavar="CONFIG",
            callback=config_file,
            help="Run config with a \\[train] section: a TOML file or a shipped config's name "
            "(`trajflow configs list`).",
        ),
    ],
    run_id: Annotated[str | None, typer.Option(help="Run id = the TrainingWorkflow's id (default: generated).")] = None,
    json_summary: Annotated[Path | None, typer.Option(help="Also write the JSON summary here.")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the whole summary (summary.json) as JSON instead of the verdict line.")
    ] = False,
    no_eval: Annotated[bool, typer.Option("--no-eval", help="Skip the held-out evaluation before and after.")] = False,
    sync: Annotated[
        bool, typer.Option("--sync", help="The synchronous baseline: alpha = 0 with the batch barrier.")
    ] = False,
    alpha: Annotated[int | None, typer.Option(help="Override the config's train.alpha.")] = None,
    seed: Annotated[
        int | None, typer.Option(help="Override the config's train.seed (each trajectory's sampling, the trainer's).")
    ] = None,
) -> None:
    """Train on the running stack: eval, the TrainingWorkflow with live progress, eval; summary + plots."""
    from trajflow.cli.commands.train import RunEnded
    from trajflow.cli.commands.train import train as run_training
    from trajflow.client import new_run_id
    from trajflow.infra.settings import load_settings
    from trajflow.infra.temporal import connect

    if run_id and "@" in run_id:
        typer.secho(f"--run-id {run_id!r}: a run id may not contain '@' (RUN@V names a version)", fg="red", err=True)
        raise typer.Exit(2)
    if run_id and _running(run_id):
        _say(f"run {run_id} is already running: attaching to it (trajflow attach {run_id}), not starting it again")
        _attach(run_id, json_summary, no_eval, as_json)
        return
    config = _config(config_path)
    _check_trainable(config)
    config = _publish_envs(config)
    overrides = {"sync": True, "alpha": 0} if sync else {}
    if alpha is not None:
        overrides["alpha"] = alpha
    if seed is not None:
        overrides["seed"] = seed
    if overrides:
        from trajflow.contracts.training import TrainSettings

        try:
            train_cfg = TrainSettings.model_validate({**config.train.model_dump(), **overrides})
        except ValueError as e:
            typer.secho(f"invalid override: {e}", fg="red", err=True)
            raise typer.Exit(2) from None
        config = config.model_copy(update={"train": train_cfg})
    settings = load_settings()
    rid = run_id or new_run_id()
    run_dir = settings.state_dir / "runs" / rid

    async def main() -> RunSummary:
        client = await connect(settings)
        return await run_training(config, settings, client, rid, run_dir, _say, skip_eval=no_eval)

    try:
        summary = asyncio.run(main())
    except RunEnded as e:  # terminated, cancelled or failed from elsewhere
        typer.secho(str(e), fg="red", err=True)
        _exit(1)
        return
    _report(summary, json_summary, as_json, run_dir)
    _exit(0)


def _running(run_id: str) -> bool:
    from trajflow.cli.commands.lifecycle import is_running
    from trajflow.infra.settings import load_settings
    from trajflow.infra.temporal import connect

    async def main() -> bool:
        return await is_running(await connect(load_settings()), run_id)

    return asyncio.run(main())


def _run_or_exit(main: Callable[[], Coroutine[object, object, T]]) -> T:
    """`asyncio.run(main())`; an unknown run, or one that ended without a result, exits 1 with its message."""
    from trajflow.cli.commands.train import RunEnded

    try:
        return asyncio.run(main())
    except (LookupError, RunEnded) as e:
        typer.secho(str(e).strip("'\""), fg="red", err=True)
        _exit(1)
        raise  # not reached: _exit leaves the process


def _attach(run_id: str, json_summary: Path | None, no_eval: bool, as_json: bool) -> None:
    from trajflow.cli.commands.lifecycle import attach as attach_run
    from trajflow.infra.settings import load_settings
    from trajflow.infra.temporal import connect

    settings = load_settings()
    run_dir = settings.state_dir / "runs" / run_id

    async def main() -> RunSummary:
        return await attach_run(await connect(settings), run_id, run_dir, _say, skip_eval=no_eval, settings=settings)

    summary = _run_or_exit(main)
    _report(summary, json_summary, as_json, run_dir)
    _exit(0)


def _report(summary: RunSummary, json_summary: Path | None, as_json: bool, run_dir: Path) -> None:
    """The end of `train` and `attach` on stdout: the verdict line, or with `--json` the whole summary (nothing
    else on stdout; progress went to stderr); `--json-summary` also writes it to a file."""
    from trajflow.cli.commands.train import verdict

    text = summary.model_dump_json(indent=2)
    if json_summary:
        json_summary.parent.mkdir(parents=True, exist_ok=True)
        json_summary.write_text(text)
    typer.echo(text if as_json else verdict(summary, run_dir / "reward.png"))


@app.command()
def attach(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The training run's id (its workflow id).")],
    json_summary: Annotated[Path | None, typer.Option(help="Also write the JSON summary here.")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the whole summary (summary.json) as JSON instead of the verdict line.")
    ] = False,
    no_eval: Annotated[bool, typer.Option("--no-eval", help="Skip the held-out evaluation after the run.")] = False,
) -> None:
    """Follow a training run started elsewhere (a `trajflow train` that died, a client, the Temporal UI): its live
    view until it ends, then the evaluation after it, summary.json and the plots in its run directory."""
    _attach(run_id, json_summary, no_eval, as_json)


@app.command()
def stop(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The training run's id (its workflow id).")],
    now: Annotated[
        bool, typer.Option("--now", help="Cancel every running trajectory at once, not after the current step.")
    ] = False,
    reason: Annotated[str, typer.Option(help="Why, as the run's result and logs will say.")] = "stopped by request",
    wait: Annotated[bool, typer.Option(help="Wait for the run to end, showing its progress.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print what happened as JSON.")] = False,
) -> None:
    """End a training run early. Graceful (the default): it admits no more trajectories, trains the current step
    (the one being trained, or else the batch its running trajectories can still complete), cancels the rest and
    ends with its result marked stopped; every step's checkpoint is already in the store. With --now, it cancels
    every running trajectory at once. Writes summary.json when no `trajflow train` is there to write it."""
    from trajflow.cli.commands.lifecycle import dumps
    from trajflow.cli.commands.lifecycle import stop as stop_run
    from trajflow.infra.settings import load_settings
    from trajflow.infra.temporal import connect

    settings = load_settings()

    async def main() -> dict[str, object]:
        client = await connect(settings)
        run_dir = settings.state_dir / "runs" / run_id
        return await stop_run(client, run_id, run_dir, _say, now=now, reason=reason, wait=wait)

    out = _run_or_exit(main)
    typer.echo(dumps(out) if as_json else f"run {run_id}: {out.get('stopped') or 'stop sent'}")
    _exit(0)


@app.command("eval")
def eval_policy(
    config_path: Annotated[
        Path,
        typer.Argument(
            metavar="CONFIG",
            callback=config_file,
            help="Run config (a TOML file or a shipped config's name): its tasks and \\[train.eval] seeds.",
        ),
    ],
    policy: Annotated[
        str | None,
        typer.Option(
            metavar="RUN[@VERSION]",
            help="A training run's published policy, at VERSION (default: its newest); without it, the base model.",
        ),
    ] = None,
    episodes: Annotated[
        int | None,
        typer.Option(min=1, max=10_000, help="Held-out seeds to evaluate (default: \\[train.eval] episodes)."),
    ] = None,
    samples: Annotated[
        int, typer.Option(min=0, max=64, help="K: sampled episodes per seed at the task's temperature, for pass@1..K.")
    ] = 0,
    concurrency: Annotated[int, typer.Option(min=1, max=1024, help="Trajectories in flight at most.")] = 64,
    json_path: Annotated[
        Path | None, typer.Option("--json", metavar="PATH", help="Write the result (with the per-seed table) as JSON.")
    ] = None,
) -> None:
    """Evaluate a published policy version (or the base model) on the config's held-out seeds, on the running
    stack: greedy success rate and mean reward, pass@k from K samples per seed, and a table per seed. The
    trajectories are pinned to that version, so newer versions of the run do not leak in. Exit 2 on a run or
    version that is not in the store (the message lists what is), 1 when the stack is not up."""
    from trajflow.cli.commands.policy_eval import EvalError, plan_eval, report, run_eval
    from trajflow.infra.settings import load_settings

    config = _publish_envs(_config(config_path))
    settings = load_settings()
    try:
        plan = plan_eval(config, settings, policy, episodes)
    except EvalError as e:  # before any Temporal client exists: an ordinary exit
        typer.secho(f"trajflow eval: {e}", fg="red", err=True)
        raise typer.Exit(e.code) from None
    try:
        result = asyncio.run(run_eval(plan, config, config_path, settings, samples, concurrency, _say))
    except EvalError as e:
        typer.secho(f"trajflow eval: {e}", fg="red", err=True)
        _exit(e.code)
        return
    typer.echo(report(result, json_path))
    if json_path:
        _say(f"json: {json_path}")
    _exit(0)


@app.command()
def chaos(
    config: ConfigOpt = DEFAULT_CONFIG,
    quick: Annotated[
        bool, typer.Option("--quick", help="10 short steps (B=8): a few minutes on the tiny config.")
    ] = False,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the counts (and faults, timeline) here.")
    ] = None,
    run_id: Annotated[str | None, typer.Option(help="Run id (default: generated, chaos-...).")] = None,
    container_kill_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of episodes whose sandbox container is killed mid-episode.")
    ] = 0.1,
    seed: Annotated[
        int, typer.Option(help="Seed of which episodes lose their container and when the trainer dies.")
    ] = 0,
) -> None:
    """Train on the embedded stack while killing its processes, the Temporal server and sandboxes; then audit the
    run's records: started, completed, infra-failed, lost, consumed twice, infra failures scored, steps done.
    Exit 0 only when nothing was lost, nothing consumed twice, no infra failure scored and every step done."""
    import uuid

    from trajflow.cli.commands.train import follow_run
    from trajflow.infra import stack
    from trajflow.infra.settings import load_settings
    from trajflow.lab.chaos import harness as chaos_mod
    from trajflow.lab.chaos import report as chaos_report

    cfg = _config(config)
    _check_trainable(cfg)
    settings = load_settings()
    if not settings.temporal_embedded:
        typer.secho(
            f"trajflow chaos kills and restarts the Temporal dev server, so it runs only on the embedded stack; the "
            f"settings point at the cluster at {settings.temporal_address} (see `trajflow up --help`)",
            fg="red",
            err=True,
        )
        _exit(2)
    cfg = _publish_envs(cfg)
    try:
        stack.up(settings, cfg, config, _say)
    except (RuntimeError, TimeoutError, ValueError) as e:
        typer.secho(f"trajflow chaos: the stack did not start: {e}", fg="red", err=True)
        _exit(1)
    rid = run_id or f"chaos-{uuid.uuid4().hex[:8]}"
    report = asyncio.run(
        chaos_mod.run_chaos(
            cfg, config, settings, _say, follow_run, quick=quick, run_id=rid, kill_rate=container_kill_rate, seed=seed
        )
    )
    typer.echo(chaos_report.format_report(report))
    out_dir = settings.state_dir / "runs" / rid
    plot = chaos_report.write_plot(report, out_dir / "chaos.png")
    chaos_report.write_json(report, json_path or out_dir / "chaos.json")
    _say(f"json: {json_path or out_dir / 'chaos.json'}" + (f"; plot: {plot}" if plot else ""))
    _exit(0 if report.ok else 1)


@app.command()
def demo(
    n: Annotated[int | None, typer.Option("--n", help="Trajectories to run (default: the config's).")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the summary as JSON here.")] = None,
    config: ConfigOpt = DEFAULT_CONFIG,
) -> None:
    """The main job for now: run a handful of trajectories of the config's tasks concurrently, then summarise."""
    from trajflow.cli.commands.rollout import run_batch

    summary = asyncio.run(run_batch(_publish_envs(_config(config)), n, _say))
    if json_path:
        json_path.write_text(json.dumps(summary, indent=2))
    _exit(1 if summary["lost"] else 0)
