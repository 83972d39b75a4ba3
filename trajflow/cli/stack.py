"""The CLI's stack commands: `setup`, `reward-image`, `up`, `down`, `status`, `worker <kind>` (one worker
process of a pool kind) and `reward-model serve` (a local reward model over HTTP). Heavy imports happen inside each
command."""

from __future__ import annotations

import asyncio
import os
import traceback
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated

import typer

from trajflow.cli.common import DEFAULT_CONFIG, ConfigOpt, PoolOpt, app, config_file, is_default_config
from trajflow.cli.common import exit_now as _exit
from trajflow.cli.common import load_config as _config
from trajflow.cli.common import load_worker_config as _worker_config
from trajflow.cli.common import say as _say

worker_app = typer.Typer(
    help="Run one worker process of a pool kind (what `trajflow up` starts).", no_args_is_help=True
)
app.add_typer(worker_app, name="worker")


@app.command()
def setup(config: ConfigOpt = DEFAULT_CONFIG) -> None:
    """Prepare what the stack needs: Docker reachable, sandbox images built, the model converted."""
    from trajflow.cli.commands.setup import prepare
    from trajflow.infra.settings import load_settings

    prepare(load_settings(), _config(config), _say)


@app.command("reward-image")
def reward_image() -> None:
    """Build (or find cached) the reward service's container image, for any platform that serves HTTP containers."""
    from trajflow.cli.commands.images import build_reward

    typer.echo(build_reward(_say))


@app.command()
def up(
    config: ConfigOpt = DEFAULT_CONFIG,
    hosts: Annotated[
        bool,
        typer.Option(
            "--hosts",
            help="Each host of the config's hardware section in its own container of the worker image (own network, "
            "CPU set, memory), the store on S3; one host per worker kind when the config places none.",
        ),
    ] = False,
) -> None:
    """Start the embedded stack in the background: Temporal + Web UI, reward service, one worker per pool kind,
    and a Prometheus scraping every worker's metrics (127.0.0.1:9090; TRAJFLOW_PROMETHEUS_PORT, 0 for none).

    With TRAJFLOW_TEMPORAL_* settings that point at a cluster (TLS, an API key or a non-loopback address; see
    docs/stack.md, "Connecting to a Temporal cluster") no dev server is started and everything uses the cluster."""
    from trajflow.cli.commands.setup import prepare
    from trajflow.infra import stack
    from trajflow.infra.settings import load_settings

    settings = load_settings()
    cfg = _config(config)
    if hosts:
        from trajflow.cli.commands.hosts import up_hosts

        _exit(up_hosts(settings, cfg, config, _say))
    prepare(settings, cfg, _say)
    try:
        stack.up(settings, cfg, config, _say)
    except (RuntimeError, TimeoutError, ValueError) as e:
        typer.secho(f"trajflow up failed: {e}", fg="red", err=True)
        _exit(1)
    if settings.temporal_embedded:
        typer.echo(f"up: Temporal Web UI at http://127.0.0.1:{settings.temporal_ui_port}  (stop with `trajflow down`)")
    else:
        typer.echo(f"up: workers on the Temporal cluster at {settings.temporal_address}  (stop with `trajflow down`)")
    if settings.prometheus_port:
        typer.echo(f"up: Prometheus (every worker's metrics) at http://127.0.0.1:{settings.prometheus_port}")
    _exit(0)


@app.command()
def down() -> None:
    """Stop exactly the processes `trajflow up` started."""
    from trajflow.infra import stack
    from trajflow.infra.settings import load_settings

    settings = load_settings()
    if (settings.run_dir / "hosts.json").exists():  # `up --hosts` ran: its containers first
        from trajflow.infra import host_admin

        typer.echo(f"down: stopped {host_admin.down(settings, _say)} host container(s)")
    n = stack.down(settings, _say)
    typer.echo(f"down: stopped {n} process(es)")


@app.command()
def status(
    run: Annotated[
        str | None, typer.Argument(metavar="[RUN]", help="A training run id or a trajectory's workflow id.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="With RUN: print JSON only.")] = False,
    limit: Annotated[int, typer.Option(help="With RUN: query at most this many running trajectories.")] = 100,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            callback=config_file,
            help="Run config (file or shipped name) whose queues to list (default: the one `up` started).",
        ),
    ] = None,
) -> None:
    """Show the stack's processes and queue pollers; with RUN, the live state of that run (or trajectory)."""
    if run is not None:
        from trajflow.cli.commands.live import main as live_main

        _exit(asyncio.run(live_main(run, limit, as_json)))
    from trajflow.infra import stack
    from trajflow.infra.processes import ProcessTable, is_alive
    from trajflow.infra.settings import load_settings

    settings = load_settings()
    records = ProcessTable(settings.run_dir).load()
    if not records:
        typer.echo(f"nothing started by `trajflow up` (state dir: {settings.state_dir})")
    if not settings.temporal_embedded:
        typer.echo(f"{'temporal':15} cluster {settings.temporal_address} namespace {settings.temporal_namespace}")
    for rec in records:
        state = "up" if is_alive(rec) else "DOWN"
        metrics = rec.env.get("TRAJFLOW_METRICS_PORT")
        served = f"  metrics :{metrics}" if metrics else ""
        if rec.name == "prometheus":
            served = f"  UI and API http://127.0.0.1:{settings.prometheus_port}"
        typer.echo(f"{rec.name:15} {state:5} pid {rec.pid:<8} log {rec.log}{served}")
    if (settings.run_dir / "hosts.json").exists():  # `up --hosts` ran: one line per host container
        from trajflow.infra import host_admin

        for line in host_admin.report(settings):
            typer.echo(line)
    if config is None:
        config = stack.started_config(records)
        if config is None or not config.exists():
            config = config_file(DEFAULT_CONFIG)
            assert config is not None
        else:
            typer.echo(f"queues of {config} (the config `trajflow up` started with; -c for another)")
    try:
        report = asyncio.run(stack.queue_report(settings, _config(config)))
    except (TimeoutError, RuntimeError, ValueError) as e:
        typer.echo(f"temporal: not reachable at {settings.temporal_address}: {e}")
        _exit(1)
    for queue, n in report:
        typer.echo(f"queue {queue:40} pollers {n}")
    _exit(0)


def _serve(main: Callable[[], Coroutine[object, object, int | None]]) -> None:
    """Run a worker until it is signalled, then exit with its code (None: 0); Temporal settings that cannot work
    (a TLS file, a wrong CA, a server that does not speak TLS) end it with their message and exit 1 instead of a
    traceback."""
    from trajflow.infra.connection import ConnectionSettingsError, TemporalConnectionError

    try:
        code = asyncio.run(main())
    except (ConnectionSettingsError, TemporalConnectionError, TimeoutError) as e:
        typer.secho(f"trajflow worker: cannot connect to Temporal: {e}", fg="red", err=True)
        _exit(1)
        return
    except Exception:  # any other failure: its traceback in the worker's log, and a non-zero exit
        traceback.print_exc()
        typer.secho("trajflow worker: stopped by the error above", fg="red", err=True)
        _exit(1)
        return
    _exit(code or 0)


@worker_app.command("orchestrator")
def worker_orchestrator() -> None:
    """Workflows only."""
    from trajflow.infra.settings import load_settings
    from trajflow.workers import orchestrator
    from trajflow.workers.common import configure_logging

    configure_logging("orchestrator")
    _serve(lambda: orchestrator.serve(load_settings()))


@worker_app.command("decode")
def worker_decode(pool: PoolOpt = ["default"], config: ConfigOpt = DEFAULT_CONFIG) -> None:  # noqa: B006
    """The LLM engine of the given decode pools (model from the config)."""
    from trajflow.infra.settings import load_settings
    from trajflow.workers import decode
    from trajflow.workers.common import configure_logging

    configure_logging("decode")
    _serve(lambda: decode.serve(load_settings(), pool, _worker_config(config).model))


@worker_app.command("env")
def worker_env(pool: PoolOpt = ["default"]) -> None:  # noqa: B006
    """Docker sandboxes of the given env pools."""
    from trajflow.infra.settings import load_settings
    from trajflow.workers import env
    from trajflow.workers.common import configure_logging

    configure_logging("env")
    _serve(lambda: env.serve(load_settings(), pool))


@worker_app.command("reward")
def worker_reward(pool: PoolOpt = ["default"]) -> None:  # noqa: B006
    """Scoring (client of the reward service) and saving trajectories for the given reward pools."""
    from trajflow.infra.settings import load_settings
    from trajflow.workers import reward
    from trajflow.workers.common import configure_logging

    configure_logging("reward")
    _serve(lambda: reward.serve(load_settings(), pool))


@worker_app.command("trainer")
def worker_trainer(pool: PoolOpt = ["default"], config: ConfigOpt = DEFAULT_CONFIG) -> None:  # noqa: B006
    """Optimizer steps of the given trainer pools (model from the config). Under `accelerate launch` (or
    torchrun) rank 0 is the worker and the other ranks train with it; see docs/training.md, "The trainer on several
    processes"."""
    from trajflow.infra.settings import load_settings
    from trajflow.workers import trainer
    from trajflow.workers.common import configure_logging

    rank = os.environ.get("RANK")
    configure_logging("trainer" if rank is None else f"trainer[{rank}]")
    _serve(lambda: trainer.serve(load_settings(), pool, _worker_config(config).model))


@worker_app.command("host")
def worker_host(
    name: Annotated[
        str, typer.Argument(help="The host's name in the config's \\[\\[hardware.hosts]] (or a default host).")
    ],
    config: ConfigOpt = DEFAULT_CONFIG,
) -> None:
    """Every worker the config places on host NAME, as child processes (what a worker-image container runs)."""
    from trajflow.infra.settings import load_settings
    from trajflow.workers.common import configure_logging
    from trajflow.workers.host import host_plan, run_host

    configure_logging(f"host {name}")
    cfg = _worker_config(config)
    try:
        settings = load_settings()
        path = None if is_default_config(config) else config
        metrics = settings.prometheus_port != 0
        children = host_plan(cfg, name, settings.reward_port, path, metrics=metrics, gpus_given=settings.gpus_given)
    except ValueError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(run_host(children))


reward_model_app = typer.Typer(
    help='Local reward models served over HTTP, batched (`kind = "local"`).', no_args_is_help=True
)
app.add_typer(reward_model_app, name="reward-model")


@reward_model_app.command("serve")
def reward_model_serve(
    model: Annotated[str, typer.Option("--model", "-m", help="A Hugging Face checkpoint dir, `smollm2` or `tiny`.")],
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8090,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    max_batch: Annotated[int, typer.Option(help="Most requests in one forward pass.")] = 16,
    max_wait_ms: Annotated[float, typer.Option(help="How long a batch waits to fill, in ms.")] = 20.0,
    squash: Annotated[bool, typer.Option(help="A one-label classifier's reward is sigmoid(logit).")] = False,
    threads: Annotated[int, typer.Option(help="torch CPU threads (0: torch's default).")] = 0,
) -> None:
    """Serve a reward model on POST /score for the reward service: a *ForSequenceClassification checkpoint's score,
    or a causal LM's P(Yes) as a yes/no verifier; concurrent requests are batched. Name it in a run config as
    \\[reward_models.NAME] with kind = "local" and url = "http://HOST:PORT"."""
    from trajflow.infra.settings import load_settings
    from trajflow.rewards.models import server

    argv = ["--model", model, "--port", str(port), "--host", host, "--max-batch", str(max_batch)]
    argv += ["--cache-dir", str(load_settings().cache_dir)]
    argv += ["--max-wait-ms", str(max_wait_ms), "--threads", str(threads), *(["--squash"] if squash else [])]
    server.main(argv)
