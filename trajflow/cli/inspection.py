"""The CLI's inspection commands: `images build|list|prune` (sandbox layers), `trajectories list|tree`
(visibility), `branch` (continue a trajectory from a turn), `trace` (one trajectory's timeline) and `replay` (rerun,
from failure, env only, history check). Heavy imports happen inside each command."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from trajflow.cli.common import app
from trajflow.cli.common import exit_now as _exit
from trajflow.cli.common import say as _say

images_app = typer.Typer(help="Sandbox images: the content-hashed layers (base, runtime, task).", no_args_is_help=True)
app.add_typer(images_app, name="images")


@images_app.command("build")
def images_build(
    task: Annotated[
        list[str] | None, typer.Option("--task", "-t", help="A shell task's layer (repeatable; default: all).")
    ] = None,
    worker: Annotated[
        bool, typer.Option("--worker", help="Build the worker image instead (runs any pool's worker; print its tag).")
    ] = False,
    cuda: Annotated[
        bool,
        typer.Option(
            "--cuda",
            help="With --worker: the CUDA variant for GPU hosts, trajflow-worker-cuda:<hash> (PyPI's CUDA build of "
            "torch and its nvidia wheels; several GB to download and about 4x the CPU image).",
        ),
    ] = False,
) -> None:
    """Build the layers that are missing (base, runtime, each shell task's); print each one's tag, cached or built.
    With --worker: the worker image, `trajflow-worker:<hash>` (see docs/stack.md, "Pools on their own hosts");
    with --worker --cuda: its CUDA variant, `trajflow-worker-cuda:<hash>`."""
    from trajflow.cli.commands.images import UnknownTask, build, build_worker

    if cuda and not worker:
        typer.secho("--cuda applies to --worker only", fg="red", err=True)
        raise typer.Exit(2)
    if worker:
        typer.echo(build_worker(_say, cuda=cuda))
        return
    try:
        lines = build(task or None, _say)
    except UnknownTask as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None
    typer.echo("\n".join(lines))


@images_app.command("list")
def images_list(as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False) -> None:
    """The layer images on this Docker engine: layer, tag, size, created, current or stale, used by a container."""
    from trajflow.cli.commands.images import listing

    typer.echo(listing(as_json))


@images_app.command("prune")
def images_prune(
    tags: Annotated[
        list[str] | None, typer.Argument(metavar="TAG", help="Only these stale layers (default: all).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")] = False,
) -> None:
    """Remove the stale layers (not what the current sources hash to), children first; keep any a container uses."""
    from trajflow.cli.commands.images import prune

    typer.echo(prune(tags or None, dry_run, typer.echo))


trajectories_app = typer.Typer(
    help="Trajectories in Temporal visibility, by their search attributes.", no_args_is_help=True
)
app.add_typer(trajectories_app, name="trajectories")


@trajectories_app.command("list")
def trajectories_list(
    status: Annotated[
        str | None,
        typer.Option(help="completed, failed, infra_failed, running (or canceled, terminated, timed_out)."),
    ] = None,
    run: Annotated[str | None, typer.Option(help="Training run id.")] = None,
    env: Annotated[str | None, typer.Option(help="Env id, e.g. game:GuessTheNumber-v0-easy.")] = None,
    task: Annotated[str | None, typer.Option(help="Task name from the run config.")] = None,
    replay_of: Annotated[str | None, typer.Option(help="Only replays of this workflow id.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many rows.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """List trajectories (newest first) and print the visibility query, which also works in the Web UI's search box."""
    from trajflow.cli.commands.visibility import main as list_main

    _exit(asyncio.run(list_main(status, run, env, task, replay_of, limit, as_json)))


@trajectories_app.command("tree")
def trajectories_tree(
    workflow_id: Annotated[str, typer.Argument(metavar="WORKFLOW_ID", help="The root trajectory's workflow id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only: the nested tree.")] = False,
) -> None:
    """Show a trajectory and its branches (`trajflow branch`), recursively and indented: each with the turn it
    branched at, its status, reward and turns (from the TrajflowBranchOf/TrajflowBranchTurn search attributes)."""
    from trajflow.cli.commands.branch import tree_main

    _exit(asyncio.run(tree_main(workflow_id, as_json)))


@app.command()
def branch(
    workflow_id: Annotated[str, typer.Argument(metavar="WORKFLOW_ID", help="The finished trajectory to branch.")],
    turn: Annotated[int, typer.Option("--turn", "-k", help="The turn (1-based) the branches sample from.")],
    n: Annotated[int, typer.Option("--n", "-n", help="How many branches.")] = 1,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the branches and print each one's outcome.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait with --wait.")] = 600.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Start N continuations of a finished trajectory from its turn K: each is a trajectory of its own that reuses
    the parent's turns 1..K-1 (their token context, and the env's state restored by replaying their actions in a
    fresh sandbox) and samples from turn K on with its own seed. Exit 2 when the trajectory cannot be branched
    there (unknown, running, no record, too few turns, K past max_turns, an agent env); with --wait, 1 unless every
    branch completed. `trajflow trajectories tree WORKFLOW_ID` shows them."""
    from trajflow.cli.commands.branch import branch_main

    _exit(asyncio.run(branch_main(workflow_id, turn, n, wait, timeout, as_json)))


@app.command()
def trace(
    workflow_id: Annotated[str, typer.Argument(metavar="WORKFLOW_ID", help="The trajectory's workflow id.")],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON only: every span and the split of the time.")
    ] = False,
) -> None:
    """Print one trajectory's trace: each span (reset, every generate and step, score, save, and beneath each its
    run on a worker) with its start and duration, and where the episode's time went (activities against
    orchestration). Reads the span files the workers write under the state dir (none when TRAJFLOW_OTLP_ENDPOINT
    sends spans to a collector)."""
    import json

    from trajflow.infra.settings import load_settings
    from trajflow.observability.timeline import render, trace_of

    settings = load_settings()
    timeline = trace_of(workflow_id, settings.traces_dir)
    if timeline is None:
        where = f"OTLP at {settings.otlp_endpoint}" if settings.otlp_endpoint else str(settings.traces_dir)
        _say(
            f"no spans of {workflow_id} in {settings.traces_dir} (the workers' spans go to {where}; "
            "TRAJFLOW_TRACES=false turns them off)"
        )
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps(timeline.to_json(), indent=2))
    else:
        typer.echo("\n".join(render(timeline)))


@app.command()
def replay(
    targets: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="WORKFLOW_ID", help="The trajectory; with --check: history files, folders or workflow ids."
        ),
    ] = None,
    from_failure: Annotated[
        bool, typer.Option("--from-failure", help="Reset the original to before its first failure and let it go on.")
    ] = False,
    env_only: Annotated[
        bool, typer.Option("--env-only", help="Re-drive a fresh sandbox with the recorded actions, no LLM.")
    ] = False,
    check: Annotated[
        bool,
        typer.Option(
            "--check", help="Replay histories (default trajflow/cli/replay/histories/*.json) against this code."
        ),
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the new run.")] = 600.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Run a trajectory again with the same request and show old beside new; or continue it from before its
    failure (--from-failure), or re-drive its env with the recorded actions (--env-only); or check recorded
    histories for non-deterministic workflow changes (--check)."""
    if check:
        from trajflow.cli.replay.check import main as check_main

        _exit(asyncio.run(check_main(targets or [])))
    if from_failure and env_only:
        _say("--from-failure and --env-only exclude each other")
        raise typer.Exit(2)
    if not targets or len(targets) != 1:
        _say("give exactly one WORKFLOW_ID (or --check)")
        raise typer.Exit(2)
    from trajflow.cli.replay.rerun import main as replay_main

    mode = "from-failure" if from_failure else "env-only" if env_only else "rerun"
    _exit(asyncio.run(replay_main(targets[0], mode, timeout, as_json, _say)))
