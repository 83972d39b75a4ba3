"""The `trajflow` command. Thin: parses arguments, imports what a command needs inside it, prints.

`--help` must stay instant, so nothing heavy (torch, transformers, docker, temporalio) is imported at module
level here.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(help="trajflow: agentic RL where every trajectory is a durable Temporal workflow.", no_args_is_help=True)
worker_app = typer.Typer(help="Run one worker process of a pool kind (what `trajflow up` starts).", no_args_is_help=True)
app.add_typer(worker_app, name="worker")
images_app = typer.Typer(help="Sandbox images: the content-hashed layers (base, runtime, task).", no_args_is_help=True)
app.add_typer(images_app, name="images")

DEFAULT_CONFIG = Path("configs/default.toml")
ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="Run config (TOML).")]
PoolOpt = Annotated[list[str], typer.Option("--pool", "-p", help="Pool to serve (repeatable).")]


def _config(path: Path):  # type: ignore[no-untyped-def]
    from contracts.config import load_run_config

    try:
        return load_run_config(path)
    except ValueError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None


def _say(msg: str) -> None:
    typer.echo(msg, err=True)


def _exit(code: int = 0) -> None:
    """End a command that used a Temporal client, skipping interpreter teardown.

    The client's Rust runtime threads can abort CPython's finalisation ("PyGILState_Release: thread state must
    be current", temporalio/sdk-python#300), turning a finished command into a crash; so flush and leave.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@app.command()
def setup(config: ConfigOpt = DEFAULT_CONFIG) -> None:
    """Prepare what the stack needs: Docker reachable, sandbox images built, the model converted."""
    from infra.settings import load_settings
    from infra.setup import prepare

    prepare(load_settings(), _config(config), _say)


@app.command("reward-image")
def reward_image() -> None:
    """Build (or find cached) the reward service's container image, for any platform that serves HTTP containers."""
    from infra.reward_image import ensure_reward_image
    from infra.settings import load_settings
    from infra.setup import docker_client

    tag = ensure_reward_image(docker_client(), load_settings().cache_dir / "images", progress=_say)
    typer.echo(tag)


@app.command()
def up(config: ConfigOpt = DEFAULT_CONFIG) -> None:
    """Start the embedded stack in the background: Temporal + Web UI, reward service, one worker per pool kind."""
    from infra import stack
    from infra.settings import load_settings
    from infra.setup import prepare

    settings = load_settings()
    cfg = _config(config)
    prepare(settings, cfg, _say)
    try:
        stack.up(settings, cfg, config, _say)
    except (RuntimeError, TimeoutError, ValueError) as e:
        typer.secho(f"trajflow up failed: {e}", fg="red", err=True)
        _exit(1)
    typer.echo(f"up: Temporal Web UI at http://127.0.0.1:{settings.temporal_ui_port}  (stop with `trajflow down`)")
    _exit(0)


@app.command()
def down() -> None:
    """Stop exactly the processes `trajflow up` started."""
    from infra import stack
    from infra.settings import load_settings

    n = stack.down(load_settings(), _say)
    typer.echo(f"down: stopped {n} process(es)")


@app.command()
def status(
    run: Annotated[
        Optional[str], typer.Argument(metavar="[RUN]", help="A training run id or a trajectory's workflow id.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="With RUN: print JSON only.")] = False,
    limit: Annotated[int, typer.Option(help="With RUN: query at most this many running trajectories.")] = 100,
    config: ConfigOpt = DEFAULT_CONFIG,
) -> None:
    """Show the stack's processes and queue pollers; with RUN, the live state of that run (or trajectory)."""
    if run is not None:
        from trajflow.live import main as live_main

        _exit(asyncio.run(live_main(run, limit, as_json)))
    from infra import stack
    from infra.processes import ProcessTable, is_alive
    from infra.settings import load_settings

    settings = load_settings()
    records = ProcessTable(settings.run_dir).load()
    if not records:
        typer.echo("nothing started by `trajflow up` (state dir: %s)" % settings.state_dir)
    for rec in records:
        state = "up" if is_alive(rec) else "DOWN"
        typer.echo(f"{rec.name:15} {state:5} pid {rec.pid:<8} log {rec.log}")
    try:
        report = asyncio.run(stack.queue_report(settings, _config(config)))
    except TimeoutError:
        typer.echo(f"temporal: not reachable at {settings.temporal_address}")
        _exit(1)
    for queue, n in report:
        typer.echo(f"queue {queue:40} pollers {n}")
    _exit(0)


@worker_app.command("orchestrator")
def worker_orchestrator() -> None:
    """Workflows only."""
    from infra.settings import load_settings
    from workers import orchestrator
    from workers.common import configure_logging

    configure_logging("orchestrator")
    asyncio.run(orchestrator.serve(load_settings()))
    _exit(0)


@worker_app.command("decode")
def worker_decode(pool: PoolOpt = ["default"], config: ConfigOpt = DEFAULT_CONFIG) -> None:  # noqa: B006
    """The LLM engine of the given decode pools (model from the config)."""
    from infra.settings import load_settings
    from workers import decode
    from workers.common import configure_logging

    configure_logging("decode")
    asyncio.run(decode.serve(load_settings(), pool, _config(config).model))
    _exit(0)


@worker_app.command("env")
def worker_env(pool: PoolOpt = ["default"]) -> None:  # noqa: B006
    """Docker sandboxes of the given env pools."""
    from infra.settings import load_settings
    from workers import env
    from workers.common import configure_logging

    configure_logging("env")
    asyncio.run(env.serve(load_settings(), pool))
    _exit(0)


@worker_app.command("reward")
def worker_reward(pool: PoolOpt = ["default"]) -> None:  # noqa: B006
    """Scoring (client of the reward service) and saving trajectories for the given reward pools."""
    from infra.settings import load_settings
    from workers import reward
    from workers.common import configure_logging

    configure_logging("reward")
    asyncio.run(reward.serve(load_settings(), pool))
    _exit(0)


@worker_app.command("trainer")
def worker_trainer(pool: PoolOpt = ["default"], config: ConfigOpt = DEFAULT_CONFIG) -> None:  # noqa: B006
    """Optimizer steps of the given trainer pools (model from the config)."""
    from infra.settings import load_settings
    from workers import trainer
    from workers.common import configure_logging

    configure_logging("trainer")
    asyncio.run(trainer.serve(load_settings(), pool, _config(config).model))
    _exit(0)


@app.command()
def rollout(
    env: Annotated[Optional[str], typer.Option(help="GEM env id (default: the config's first task).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Environment seed (default: --request's, else 0).")] = None,
    task: Annotated[Optional[str], typer.Option(help="Task name from the config.")] = None,
    max_turns: Annotated[Optional[int], typer.Option(help="Turn limit.")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="Sampling temperature (0: greedy).")] = None,
    request: Annotated[
        Optional[str],
        typer.Option(help='TrajectoryRequest fields as one JSON object, over the task\'s (e.g. \'{"seed": 3}\'); the options above win.'),
    ] = None,
    workflow_id: Annotated[Optional[str], typer.Option(help="Workflow id (default: generated).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON only.")] = False,
    config: ConfigOpt = DEFAULT_CONFIG,
) -> None:
    """Run one trajectory on the stack and print its transcript, reward, status and timing."""
    from trajflow.rollout import request_from_config, run_and_report

    try:
        req = request_from_config(_config(config), task, env, seed, max_turns, temperature, request)
    except ValueError as e:  # bad input: say what to fix, exit 2 before touching the stack
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None
    _exit(asyncio.run(run_and_report(req, workflow_id, as_json)))


@app.command()
def train(
    config_path: Annotated[Path, typer.Argument(metavar="CONFIG", help="Run config (TOML) with a [train] section.")],
    run_id: Annotated[Optional[str], typer.Option(help="Run id = the TrainingWorkflow's id (default: generated).")] = None,
    json_summary: Annotated[Optional[Path], typer.Option(help="Also write the JSON summary here.")] = None,
    no_eval: Annotated[bool, typer.Option("--no-eval", help="Skip the held-out evaluation before and after.")] = False,
    sync: Annotated[bool, typer.Option("--sync", help="The synchronous baseline: alpha = 0 with the batch barrier.")] = False,
    alpha: Annotated[Optional[int], typer.Option(help="Override the config's train.alpha.")] = None,
) -> None:
    """Train on the running stack: eval, the TrainingWorkflow with live progress, eval; summary + plots."""
    from infra.settings import load_settings
    from infra.store import open_store
    from contracts.runs import RunSummary
    from infra.temporal import connect
    from trajflow.client import new_run_id
    from trajflow.train import train as run_training

    config = _config(config_path)
    overrides = {"sync": True, "alpha": 0} if sync else {}
    if alpha is not None:
        overrides["alpha"] = alpha
    if overrides:
        from contracts.training import TrainSettings

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
        store = open_store(settings.resolved_store_url, s3_endpoint_url=settings.s3_endpoint_url, s3_region=settings.s3_region)
        return await run_training(config, settings, client, store, rid, run_dir, _say, skip_eval=no_eval)

    summary = asyncio.run(main())
    if json_summary:
        json_summary.parent.mkdir(parents=True, exist_ok=True)
        json_summary.write_text(summary.model_dump_json(indent=2))
    shown = {"eval_before", "eval_after", "steps", "trajectories_trained", "trajectories_dropped_stale", "wall_seconds"}
    typer.echo(json.dumps(summary.model_dump(mode="json", include=shown), indent=2))
    _exit(0)


@app.command()
def chaos(
    config: ConfigOpt = DEFAULT_CONFIG,
    quick: Annotated[bool, typer.Option("--quick", help="6 short steps (B=8): a few minutes on the tiny config.")] = False,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the counts (and faults, timeline) here.")] = None,
    run_id: Annotated[Optional[str], typer.Option(help="Run id (default: generated, chaos-...).")] = None,
    container_kill_rate: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of episodes whose sandbox container is killed mid-episode.")] = 0.1,
    seed: Annotated[int, typer.Option(help="Seed of which episodes lose their container and when the trainer dies.")] = 0,
) -> None:
    """Train on the embedded stack while killing its processes, the Temporal server and sandboxes; then audit the
    run's records: started, completed, infra-failed, lost, consumed twice, infra failures scored, steps done.
    Exit 0 only when nothing was lost, nothing consumed twice, no infra failure scored and every step done."""
    import uuid

    from infra import stack
    from infra.settings import load_settings
    from trajflow import chaos as chaos_mod

    settings = load_settings()
    cfg = _config(config)
    try:
        stack.up(settings, cfg, config, _say)
    except (RuntimeError, TimeoutError, ValueError) as e:
        typer.secho(f"trajflow chaos: the stack did not start: {e}", fg="red", err=True)
        _exit(1)
    rid = run_id or f"chaos-{uuid.uuid4().hex[:8]}"
    report = asyncio.run(
        chaos_mod.run_chaos(cfg, config, settings, _say, quick=quick, run_id=rid, kill_rate=container_kill_rate, seed=seed)
    )
    typer.echo(chaos_mod.format_report(report))
    out_dir = settings.state_dir / "runs" / rid
    plot = chaos_mod.write_plot(report, out_dir / "chaos.png")
    chaos_mod.write_json(report, json_path or out_dir / "chaos.json")
    _say(f"json: {json_path or out_dir / 'chaos.json'}" + (f"; plot: {plot}" if plot else ""))
    _exit(0 if report.ok else 1)


@app.command()
def demo(
    n: Annotated[Optional[int], typer.Option("--n", help="Trajectories to run (default: the config's).")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Also write the summary as JSON here.")] = None,
    config: ConfigOpt = DEFAULT_CONFIG,
) -> None:
    """The main job for now: run a handful of trajectories of the config's tasks concurrently, then summarise."""
    from trajflow.rollout import run_batch

    summary = asyncio.run(run_batch(_config(config), n, _say))
    if json_path:
        json_path.write_text(json.dumps(summary, indent=2))
    _exit(1 if summary["lost"] else 0)


@images_app.command("build")
def images_build(
    task: Annotated[
        Optional[list[str]], typer.Option("--task", "-t", help="A shell task's layer (repeatable; default: all).")
    ] = None,
) -> None:
    """Build the layers that are missing (base, runtime, each shell task's); print each one's tag, cached or built."""
    from trajflow.images import UnknownTask, build

    try:
        lines = build(task or None, _say)
    except UnknownTask as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None
    typer.echo("\n".join(lines))


@images_app.command("list")
def images_list(as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False) -> None:
    """The layer images on this Docker engine: layer, tag, size, created, current or stale, used by a container."""
    from trajflow.images import listing

    typer.echo(listing(as_json))


@images_app.command("prune")
def images_prune(
    tags: Annotated[
        Optional[list[str]], typer.Argument(metavar="TAG", help="Only these stale layers (default: all).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")] = False,
) -> None:
    """Remove the stale layers (not what the current sources hash to), children first; keep any a container uses."""
    from trajflow.images import prune

    typer.echo(prune(tags or None, dry_run, typer.echo))


trajectories_app = typer.Typer(help="Trajectories in Temporal visibility, by their search attributes.", no_args_is_help=True)
app.add_typer(trajectories_app, name="trajectories")


@trajectories_app.command("list")
def trajectories_list(
    status: Annotated[
        Optional[str],
        typer.Option(help="completed, failed, infra_failed, running (or canceled, terminated, timed_out)."),
    ] = None,
    run: Annotated[Optional[str], typer.Option(help="Training run id.")] = None,
    env: Annotated[Optional[str], typer.Option(help="Env id, e.g. game:GuessTheNumber-v0-easy.")] = None,
    task: Annotated[Optional[str], typer.Option(help="Task name from the run config.")] = None,
    replay_of: Annotated[Optional[str], typer.Option(help="Only replays of this workflow id.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many rows.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """List trajectories (newest first) and print the visibility query, which also works in the Web UI's search box."""
    from trajflow.visibility import main as list_main

    _exit(asyncio.run(list_main(status, run, env, task, replay_of, limit, as_json)))


@app.command()
def replay(
    targets: Annotated[
        Optional[list[str]],
        typer.Argument(metavar="WORKFLOW_ID", help="The trajectory; with --check: history files, folders or workflow ids."),
    ] = None,
    from_failure: Annotated[
        bool, typer.Option("--from-failure", help="Reset the original to before its first failure and let it go on.")
    ] = False,
    env_only: Annotated[
        bool, typer.Option("--env-only", help="Re-drive a fresh sandbox with the recorded actions, no LLM.")
    ] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Replay histories (default tests/histories/*.json) against this code.")
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the new run.")] = 600.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Run a trajectory again with the same request and show old beside new; or continue it from before its
    failure (--from-failure), or re-drive its env with the recorded actions (--env-only); or check recorded
    histories for non-deterministic workflow changes (--check)."""
    if check:
        from trajflow.replay_check import main as check_main

        _exit(asyncio.run(check_main(targets or [])))
    if from_failure and env_only:
        _say("--from-failure and --env-only exclude each other")
        raise typer.Exit(2)
    if not targets or len(targets) != 1:
        _say("give exactly one WORKFLOW_ID (or --check)")
        raise typer.Exit(2)
    from trajflow.replay import main as replay_main

    mode = "from-failure" if from_failure else "env-only" if env_only else "rerun"
    _exit(asyncio.run(replay_main(targets[0], mode, timeout, as_json, _say)))


bench_app = typer.Typer(help="Benchmarks: measure and report, on a labelled workload.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("pipeline")
def bench_pipeline(
    quick: Annotated[bool, typer.Option("--quick", help="Smoke run in under a minute (B=8, 2 steps, 0.01 s units).")] = False,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Also write the figures as JSON here.")] = None,
    unit_s: Annotated[Optional[float], typer.Option("--unit-s", help="Seconds per workload unit (the median LLM turn).")] = None,
    env_mean: Annotated[Optional[float], typer.Option("--env-mean", help="Mean env step delay, units (default 5).")] = None,
    env_sigma: Annotated[Optional[float], typer.Option("--env-sigma", help="Env delay σ of the training runs, units (default 5).")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", help="Trainer steps per mode (default 6; quick 2).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the simulated engine.")] = 0,
) -> None:
    """Sync vs async (α = 1, 2) throughput and trajectory- vs batch-level env interaction, on one embedded stack."""
    from infra.settings import load_settings
    from trajflow.bench_pipeline import main as bench_main
    from trajflow.bench_workload import Workload, quick_workload

    fields = {
        k: v
        for k, v in {"unit_s": unit_s, "env_mean": env_mean, "env_sigma": env_sigma, "steps": steps, "seed": seed}.items()
        if v is not None
    }
    try:
        workload = quick_workload(**fields) if quick else Workload(**fields)
    except ValueError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None
    _exit(bench_main(workload, json_path, load_settings().cache_dir / "models"))


@bench_app.command("sandbox")
def bench_sandbox(
    quick: Annotated[bool, typer.Option("--quick", help="Smoke run (~2 min): small N, no cold base.")] = False,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Also write the figures as JSON here.")] = None,
    env: Annotated[
        str, typer.Option("--env", help="Env id, e.g. shell:roman-numerals or game:GuessTheNumber-v0-easy.")
    ] = "shell:roman-numerals",
    action: Annotated[
        Optional[str], typer.Option("--action", help="The cheap action stepped (default: echo hi / \\boxed{5}).")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Env seed and the killer's random seed.")] = 0,
) -> None:
    """Env sandboxes on this machine: warm/cold reset latency, layer builds, steps/s, resets while containers die."""
    from infra.settings import load_settings
    from trajflow.bench_sandbox import Plan, quick_plan
    from trajflow.bench_sandbox import main as bench_main

    fields = {"env_id": env, "action": action, "seed": seed}
    raise typer.Exit(bench_main(quick_plan(**fields) if quick else Plan(**fields), json_path, load_settings()))


if __name__ == "__main__":
    app()
