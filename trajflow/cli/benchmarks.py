"""The CLI's `bench pipeline`, `bench sandbox`, `bench real`, `bench gpu`, `bench contention`, `bench lora`,
`bench prefix-cache`, `bench batching`, `bench scale` and `bench soak` commands: parse the options, then hand over to
`trajflow/lab/bench/`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trajflow.cli.common import DEFAULT_CONFIG, ConfigOpt, app
from trajflow.cli.common import exit_now as _exit
from trajflow.cli.common import load_config as _config
from trajflow.cli.common import say as _say

bench_app = typer.Typer(help="Benchmarks: measure and report, on a labelled workload.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("pipeline")
def bench_pipeline(
    quick: Annotated[
        bool, typer.Option("--quick", help="Smoke run in under a minute (B=8, 2 steps, 0.01 s units).")
    ] = False,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the figures as JSON here.")] = None,
    unit_s: Annotated[
        float | None, typer.Option("--unit-s", help="Seconds per workload unit (the median LLM turn).")
    ] = None,
    env_mean: Annotated[
        float | None, typer.Option("--env-mean", help="Mean env step delay, units (default 5).")
    ] = None,
    env_sigma: Annotated[
        float | None, typer.Option("--env-sigma", help="Env delay σ of the training runs, units (default 5).")
    ] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="Trainer steps per mode (default 6; quick 2).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the simulated engine.")] = 0,
) -> None:
    """Sync vs async (α = 1, 2) throughput and trajectory- vs batch-level env interaction, on one embedded stack."""
    from trajflow.infra.settings import load_settings
    from trajflow.lab.bench.pipeline import main as bench_main
    from trajflow.lab.bench.workload import Workload, quick_workload

    fields = {
        k: v
        for k, v in {
            "unit_s": unit_s,
            "env_mean": env_mean,
            "env_sigma": env_sigma,
            "steps": steps,
            "seed": seed,
        }.items()
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
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the figures as JSON here.")] = None,
    env: Annotated[
        str, typer.Option("--env", help="Env id, e.g. shell:roman-numerals or game:GuessTheNumber-v0-easy.")
    ] = "shell:roman-numerals",
    action: Annotated[
        str | None, typer.Option("--action", help="The cheap action stepped (default: echo hi / \\boxed{5}).")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Env seed and the killer's random seed.")] = 0,
) -> None:
    """Env sandboxes on this machine: warm/cold reset latency, layer builds, steps/s, resets while containers die."""
    from trajflow.infra.settings import load_settings
    from trajflow.lab.bench.sandboxes import Plan, quick_plan
    from trajflow.lab.bench.sandboxes import main as bench_main

    fields = {"env_id": env, "action": action, "seed": seed}
    raise typer.Exit(bench_main(quick_plan(**fields) if quick else Plan(**fields), json_path, load_settings()))


@bench_app.command("real")
def bench_real(
    config: ConfigOpt = DEFAULT_CONFIG,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick", help="4 steps of 8 trajectories (groups of 4) per mode (18 min on 2 AVX2 cores, 5 with bf16)."
        ),
    ] = False,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the figures as JSON here.")] = None,
    steps: Annotated[int | None, typer.Option("--steps", min=2, help="Steps per mode (default 6; quick 4).")] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", min=1, help="Trajectories per step.")] = None,
    group_size: Annotated[int | None, typer.Option("--group-size", min=1, help="GRPO group size.")] = None,
    alphas: Annotated[str, typer.Option("--alphas", help="Comma-separated α of the async modes.")] = "1,2",
) -> None:
    """Sync (α = 0) against α = 1 and 2 on the real workload of CONFIG, on the running stack (`trajflow up`,
    or `trajflow up --hosts`): trajectories/s, busy fractions, G, T, the reference ratio (G+T)/max(G,T)."""
    from dataclasses import replace

    from trajflow.lab.bench.real import RealPlan, quick_plan
    from trajflow.lab.bench.real import main as bench_main

    try:
        plan = quick_plan() if quick else RealPlan()
        parsed = tuple(int(a) for a in alphas.split(","))
        if any(a < 1 for a in parsed):
            raise ValueError("--alphas: each α of an async mode is at least 1 (sync, α = 0, always runs)")
        fields = {"steps": steps, "batch_size": batch_size, "group_size": group_size}
        plan = replace(plan, alphas=parsed, **{k: v for k, v in fields.items() if v is not None})
        cfg = _config(config)
        plan.run_config(cfg, 0)  # a batch that is no multiple of the group fails here, not after a mode ran
    except ValueError as e:
        typer.secho(f"bench real: {e}", fg="red", err=True)
        raise typer.Exit(2) from None
    _exit(bench_main(cfg, plan, json_path, _say))


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


@bench_app.command("contention")
def bench_contention(
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the figures as JSON here.")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="The tiny model: a smoke test, not a measurement.")] = False,
) -> None:
    """Decode (HF engine, SmolLM2) and trainer steps overlapping in two processes on this machine's cores, under
    torch's default threads, the hardware section's defaults, and OMP_WAIT_POLICY=PASSIVE; and each alone."""
    from trajflow.infra.settings import load_settings
    from trajflow.lab.bench.contention import main as contention_main

    _exit(contention_main(quick, json_path, load_settings().cache_dir / "models"))


@bench_app.command("lora")
def bench_lora(
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the figures as JSON here.")] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Timed steps per option, after one warm-up step.")] = 3,
    rank: Annotated[int, typer.Option("--rank", min=1, help="LoRA rank (alpha = 2 x rank).")] = 16,
    quick: Annotated[bool, typer.Option("--quick", help="The tiny model: a smoke test, not a measurement.")] = False,
) -> None:
    """Trainer step time, peak memory, checkpoint and export of LoRA (every projection) against the last-8-blocks
    option, and of last-8-blocks with logits at every position (the trainer before it skipped the prompt), on the
    default config's shape (SmolLM2-135M, its batch of episodes, micro_batch 8), each in a fresh process."""
    from trajflow.infra.settings import load_settings
    from trajflow.lab.bench.lora import main as lora_main

    _exit(lora_main(quick, json_path, load_settings().cache_dir / "models", steps, rank))


@bench_app.command("prefix-cache")
def bench_prefix_cache(
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the figures as JSON here, a plot beside.")
    ] = None,
    episodes: Annotated[
        int, typer.Option("--episodes", min=1, help="Episodes played at once, one batch per turn.")
    ] = 32,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="Torch threads (default: the decode worker's).")
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="The tiny model: a smoke test, not a measurement.")] = False,
    dtype: Annotated[
        str, typer.Option("--dtype", help="auto (the CPU's native choice), float32 or bfloat16.")
    ] = "auto",
) -> None:
    """The HF engine playing the default task's episodes (GEM GuessTheNumber, SmolLM2) turn by turn with and
    without its prefix cache, side by side: seconds per turn, prompt tokens reused, identical completions."""
    from trajflow.infra.settings import load_settings
    from trajflow.lab.bench.prefix_cache import main as prefix_main

    _exit(prefix_main(quick, json_path, load_settings().cache_dir / "models", episodes, threads, dtype))


@bench_app.command("batching")
def bench_batching(
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the figures as JSON here.")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Fewer, shorter trajectories (a few minutes).")] = False,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="Torch threads (default: the decode worker's).")
    ] = None,
    tiny: Annotated[bool, typer.Option("--tiny", help="The tiny model: a smoke test, not a measurement.")] = False,
    dtype: Annotated[
        str, typer.Option("--dtype", help="auto (the device's native choice), float32 or bfloat16.")
    ] = "auto",
    device: Annotated[str, typer.Option("--device", help="cpu (default), auto, cuda or cuda:N.")] = "cpu",
    random_weights: Annotated[
        bool,
        typer.Option("--random-weights", help="SmolLM2's architecture with random weights and token-id prompts."),
    ] = False,
    prefix_cache_mb: Annotated[
        int | None,
        typer.Option(
            "--prefix-cache-mb", min=0, help="The engines' prefix cache in MB (default: the config's; 0: none)."
        ),
    ] = None,
) -> None:
    """The HF engine's static and continuous batching side by side on the demo's workload and a long-tailed one:
    decode tokens/s, p50/p99 request latency, requests/s and trajectories/s, each as a ratio continuous/static."""
    from trajflow.infra.settings import load_settings
    from trajflow.lab.bench.batching import main as batching_main

    models = load_settings().cache_dir / "models"
    _exit(batching_main(quick, json_path, models, threads, tiny, dtype, device, random_weights, prefix_cache_mb))


@bench_app.command("reward-model")
def bench_reward_model(
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the figures as JSON here.")] = None,
    requests: Annotated[int, typer.Option("--requests", min=2, max=500, help="Requests sent at once.")] = 48,
    max_batch: Annotated[int, typer.Option("--max-batch", min=2, help="The batched setting's largest batch.")] = 16,
    port: Annotated[int, typer.Option("--port", help="Port the server listens on while measured.")] = 8091,
    quick: Annotated[bool, typer.Option("--quick", help="The tiny model: a smoke test, not a measurement.")] = False,
) -> None:
    """A local reward model (SmolLM2 as a yes/no verifier, `trajflow reward-model serve`) at --max-batch 1 and
    batched, side by side: requests/s, the batches formed, and that batching leaves every reward the same."""
    from trajflow.lab.bench.reward_model import main as reward_model_main

    _exit(reward_model_main(quick, json_path, requests, max_batch, port))


@bench_app.command("scale")
def bench_scale(
    quick: Annotated[
        bool, typer.Option("--quick", help="Smoke run (~1.5 min): 20 and 100 in flight, short turns.")
    ] = False,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the figures as JSON here.")] = None,
    levels: Annotated[
        str | None, typer.Option("--levels", help="Trajectories in flight, comma-separated (default 100,1000,5000).")
    ] = None,
    window_s: Annotated[
        float | None, typer.Option("--window-s", help="Seconds measured at each level, at least (default 90).")
    ] = None,
    turns: Annotated[int | None, typer.Option("--turns", help="Turns per trajectory (default 4).")] = None,
) -> None:
    """The orchestration at 100, 1,000 and 5,000 trajectories in flight on one embedded stack (simulated engine,
    synthetic env, real reward service and store): trajectories/s, activities/s, overhead per activity (p50/p99),
    CPU of workers and server, history sizes, what saturates first, and how many were lost (exit 1 if any)."""
    from trajflow.infra.settings import load_settings
    from trajflow.lab.bench.scale import ScaleWorkload, main, quick_scale

    fields: dict[str, object] = {k: v for k, v in {"window_s": window_s, "turns": turns}.items() if v is not None}
    if levels is not None:
        try:
            fields["levels"] = tuple(int(x) for x in levels.split(","))
        except ValueError:
            typer.secho(f"--levels: not comma-separated whole numbers: {levels!r}", fg="red", err=True)
            raise typer.Exit(2) from None
    try:
        sw = quick_scale(**fields) if quick else ScaleWorkload(**fields)  # type: ignore[arg-type]
    except (TypeError, ValueError) as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None
    _exit(main(sw, json_path, load_settings().cache_dir / "models", _say))


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
        int | None, typer.Option("--batch", help="With --scale: B, trajectories a step (default 8192; CI 512).")
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

        fields = {k: v for k, v in {"steps": steps, "batch_size": batch}.items() if v is not None}
        try:
            ss = ScaleSoak(**fields)
        except ValueError as e:
            typer.secho(str(e), fg="red", err=True)
            raise typer.Exit(2) from None
        _exit(scale_main(ss, json_path, cache, _say))
        return
    if batch is not None:
        typer.secho("--batch goes with --scale", fg="red", err=True)
        raise typer.Exit(2)
    from trajflow.lab.bench.soak import SoakWorkload, main, quick_soak

    fields = {"steps": steps} if steps is not None else {}
    try:
        sw = quick_soak(**fields) if quick else SoakWorkload(**fields)
    except ValueError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None
    _exit(main(sw, json_path, cache, _say))
