"""The CLI's `configs` commands: the run configs shipped with trajflow, listed (`configs list`) and printed
(`configs show NAME`, to start a config of your own from one). Every command that takes a config accepts such a name
where it takes a path. Imports nothing heavy at module level."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from trajflow.cli.common import app

configs_app = typer.Typer(
    help="The run configs shipped with trajflow: use one by name (`trajflow up -c tiny`, `trajflow train default`).",
    no_args_is_help=True,
)
app.add_typer(configs_app, name="configs")


def _summary(name: str) -> dict[str, object]:
    from trajflow.contracts.config import load_run_config, shipped_configs

    path = shipped_configs()[name]
    config = load_run_config(path)
    return {
        "name": name,
        "path": str(path),
        "model": config.model.name_or_path,
        "engine": config.model.engine,
        "tasks": [t.env_id for t in config.tasks],
        "steps": config.train.steps,
        "batch_size": config.train.batch_size,
    }


@configs_app.command("list")
def configs_list(as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False) -> None:
    """List the shipped configs: name, model, tasks and training steps; the name works wherever a config does."""
    from trajflow.contracts.config import shipped_configs

    rows = [_summary(name) for name in shipped_configs()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        tasks = ", ".join(str(t) for t in r["tasks"])  # type: ignore[union-attr]
        typer.echo(
            f"{r['name']:10} {r['model']:10} {r['engine']:7} steps {r['steps']:<4} B {r['batch_size']:<4} {tasks}"
        )


@configs_app.command("show")
def configs_show(
    name: Annotated[str, typer.Argument(help="A shipped config's name (`trajflow configs list`).")],
) -> None:
    """Print a shipped config's TOML, e.g. `trajflow configs show default > my.toml` to start one of your own."""
    from trajflow.contracts.config import shipped_configs

    shipped = shipped_configs()
    if name.removesuffix(".toml") not in shipped:
        typer.secho(f"no shipped config {name!r}; shipped: {', '.join(shipped)}", fg="red", err=True)
        raise typer.Exit(2)
    typer.echo(shipped[name.removesuffix(".toml")].read_text(), nl=False)
