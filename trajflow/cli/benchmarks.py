"""The CLI's `bench gpu` and `bench soak` commands: parse the options, then hand over to `trajflow/lab/bench/`.
The finished studies (pipeline, sandbox, real, contention, lora, prefix-cache, batching, reward-model, scale) keep
their results in docs/results and their code in git history."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trajflow.cli.common import app
from trajflow.cli.common import exit_now as _exit
from trajflow.cli.common import say as _say

bench_app = typer.Typer(help="Benchmarks: measure and report, on a labelled workload.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("gpu")
def bench_gpu(
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the figures as JSON here.")] = None,
    device: Annotated[
        str, typer.Option("--device", help="auto (a GPU when one is visible), cpu, cuda or cuda:N.")
    ] = "auto",
    quick: Annotated[
        bool, typer.Option("--quick", help="A tiny model: a smoke test of the path, not a measurement.")
    ] = False,
) -> None:
    """HF engine tokens/s at batch 1, 16, 64 and trainer step time (the default job's shape), SmolLM2's architecture
    with random weights, on a GPU (or --device cpu). Same as `python -m trajflow.lab.bench.gpu_check`, which needs no
    services."""
    from trajflow.lab.bench.gpu_check import main as gpu_main

    _exit(
        gpu_main(
            [*(["--json", str(json_path)] if json_path else []), "--device", device, *(["--quick"] if quick else [])]
        )
    )


@bench_app.command("soak")
def bench_soak(
    quick: Annotated[bool, typer.Option("--quick", help="The CI run (~1 min): 60 steps of B=4.")] = False,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the figures as JSON here.")] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="Training steps (default 300; --scale 3).")] = None,
    scale: Annotated[
        bool,
        typer.Option(
            "--scale",
            help="Steps of thousands instead: a sharded run of B trajectories a step (groups of 8, alpha 1, one "
            "turn), continuing as new about once a step; reports each step's time (store load, trainer, the rest) "
            "and the dev server's activities/s.",
        ),
    ] = False,
    batch: Annotated[
        int | None, typer.Option("--batch", help="With --scale: B, trajectories a step (default 8192; CI 256).")
    ] = None,
    groups_per_shard: Annotated[
        int | None,
        typer.Option(
            "--groups-per-shard",
            help="With --scale: the groups of a shard (default: the run's own, 64 past 512 trajectories in flight), "
            "so that a smaller B runs sharded too.",
        ),
    ] = None,
) -> None:
    """One training run on the embedded bench stack (dev server, simulated engine, env and trainer), audited at the
    end: every version once, every trajectory accounted for (exit 1 if anything is lost). By default hundreds of
    small steps that continue as new every few steps; with --scale a few steps of thousands of trajectories in shards,
    each step's time taken apart."""
    from trajflow.infra.settings import load_settings

    cache = load_settings().cache_dir / "models"
    if scale:
        from trajflow.lab.bench.soak_scale import ScaleSoak
        from trajflow.lab.bench.soak_scale import main as scale_main

        given = {"steps": steps, "batch_size": batch, "groups_per_shard": groups_per_shard}
        fields = {k: v for k, v in given.items() if v is not None}
        try:
            ss = ScaleSoak(**fields)
        except ValueError as e:
            typer.secho(str(e), fg="red", err=True)
            raise typer.Exit(2) from None
        _exit(scale_main(ss, json_path, cache, _say))
        return
    if batch is not None or groups_per_shard is not None:
        typer.secho("--batch and --groups-per-shard go with --scale", fg="red", err=True)
        raise typer.Exit(2)
    from trajflow.lab.bench.soak import SoakWorkload, main, quick_soak

    fields = {"steps": steps} if steps is not None else {}
    try:
        sw = quick_soak(**fields) if quick else SoakWorkload(**fields)
    except ValueError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None
    _exit(main(sw, json_path, cache, _say))
