"""The CLI's `analyze` commands: read what a trained policy does from its recorded eval trajectories
(`trajflow/lab/analysis/`). Heavy imports happen inside each command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from trajflow.cli.common import app

analyze_app = typer.Typer(
    help="Read what a policy does from its recorded eval trajectories (beyond the success rate).",
    no_args_is_help=True,
)
app.add_typer(analyze_app, name="analyze")


@analyze_app.command("guess-the-number")
def analyze_guess_the_number(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The training run whose evals to read.")],
    version: Annotated[
        list[int] | None,
        typer.Option("--version", "-v", help="An evaluated policy version (repeatable; default: every one found)."),
    ] = None,
    prefix: Annotated[
        str | None,
        typer.Option(help="Read the eval whose workflow ids are PREFIX-<i> instead (e.g. one `trajflow eval` ran)."),
    ] = None,
    split: Annotated[int, typer.Option(min=1, help="Compare success on targets 1..SPLIT with those above.")] = 6,
    plot: Annotated[
        Path | None, typer.Option(metavar="PNG", help="Also plot success by target, one bar per eval.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """How a Guess The Number policy plays its held-out games, per eval of the run (`trajflow train` evaluates
    before and after, and every `\\[train.eval] every` steps): success by target, targets 1..SPLIT against those
    above, how often a second guess moves the way the first guess's hint says, and the first guesses it makes.
    Reads the greedy eval trajectories from the store; the stack need not be up. Exit 2 when there is nothing to
    read or the trajectories are not games of Guess The Number."""
    from trajflow.infra.settings import load_settings
    from trajflow.infra.store import open_store_from
    from trajflow.lab.analysis import guess_the_number as gtn

    store = open_store_from(load_settings())
    if prefix is not None:
        prefixes = {prefix: prefix}
    else:
        found = gtn.eval_prefixes(store, run_id)
        prefixes = {f"v{v}": found.get(v, gtn.eval_prefix(run_id, v)) for v in (version or found)}
    reports = {}
    try:
        for label, p in prefixes.items():
            records = gtn.eval_records(store, p)
            if not records:
                raise gtn.AnalysisError(f"no eval trajectories under the workflow-id prefix {p!r}")
            reports[label] = gtn.summarise(gtn.games_of(records), split)
    except gtn.AnalysisError as e:
        typer.secho(f"trajflow analyze: {e}", fg="red", err=True)
        raise typer.Exit(2) from None
    if not reports:
        typer.secho(f"trajflow analyze: run {run_id!r} has no eval trajectories in the store", fg="red", err=True)
        raise typer.Exit(2)
    if plot is not None:
        gtn.plot_report(reports, str(plot))
    if as_json:
        typer.echo(json.dumps({label: r.to_json() for label, r in reports.items()}, indent=2))
        return
    for label, report in reports.items():
        typer.echo(gtn.format_report(report, f"{run_id} {label}" if prefix is None else label))
    if plot is not None:
        typer.echo(f"plot: {plot}")
