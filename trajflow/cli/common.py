"""What every command module of the CLI shares: the `app`, the config and pool options, loading a run config
(bad input exits 2), progress lines to stderr, and leaving after a Temporal client was used.

Imports nothing heavy (typer and the stdlib only), so `trajflow --help` stays instant.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

if TYPE_CHECKING:
    from trajflow.contracts.config import RunConfig
    from trajflow.contracts.tasks import TaskConfig

T = TypeVar("T")

app = typer.Typer(
    help="trajflow: agentic RL where every trajectory is a durable Temporal workflow.", no_args_is_help=True
)

DEFAULT_CONFIG = Path("default")
"""The shipped config named `default` (`trajflow configs list`); options resolve it to its file."""


def config_file(value: Path | None) -> Path | None:
    """A `--config`/CONFIG value as the file it names: a path that exists, else a shipped config's name (`default`,
    `tiny`, ...). Anything else is a usage error (exit 2) that lists the shipped configs."""
    if value is None:
        return None
    from trajflow.contracts.config import resolve_config

    try:
        return resolve_config(value)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def is_default_config(path: Path) -> bool:
    """`path` is the shipped default config (what an option without a value resolves to)."""
    return config_file(path) == config_file(DEFAULT_CONFIG)


CONFIG_HELP = "Run config: a TOML file, or a shipped config's name (`trajflow configs list`)."
ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help=CONFIG_HELP, callback=config_file)]
PoolOpt = Annotated[list[str], typer.Option("--pool", "-p", help="Pool to serve (repeatable).")]


def load_config(path: Path) -> RunConfig:
    from trajflow.contracts.config import load_run_config

    try:
        return load_run_config(path)
    except ValueError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None


def load_worker_config(path: Path) -> RunConfig:
    """A worker's run config: `path`, or when no `--config` was given and `TRAJFLOW_RUN_CONFIG` holds a config's
    TOML text (how `trajflow up --hosts` hands a config to a container), that text."""
    from trajflow.contracts.config import parse_run_config
    from trajflow.infra.settings import load_settings

    text = load_settings().run_config
    if not is_default_config(path) or not text:
        return load_config(path)

    try:
        return parse_run_config(text, "TRAJFLOW_RUN_CONFIG")
    except ValueError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None


def publish_envs(config: RunConfig) -> RunConfig:
    """`config` with its `py:` tasks' envs (and `data:` tasks' files) checked, their requirements resolved and
    their packages put into the stack's object store (`trajflow/sandbox/user/`); a bad one exits 2 saying what to fix,
    before anything starts."""
    from trajflow.sandbox.user.submit import packaged, publish_config

    check_tools(config)
    if not any(packaged(t.env_id) or t.env_path for t in config.tasks):
        return config
    return published(lambda store, wheel_cache: publish_config(config, store, wheel_cache, say))


def check_trainable(config: RunConfig) -> None:
    """Exit 2 when the config decodes on a frozen policy (`engine = "openai"`), which never loads the versions a run's
    trainer publishes (the training workflow refuses such a pool too, `trajflow.workflows.preflight`)."""
    if config.model.engine == "openai":
        version = config.model.openai.policy_version if config.model.openai else 0
        typer.secho(
            f'[model] engine = "openai" serves a frozen policy (v{version} of the server model): it never loads the '
            "versions a training run publishes, so the run would train one step and then wait for ever. Train with "
            'engine = "hf" or "vllm"; use this config for eval and rollouts',
            fg="red",
            err=True,
        )
        raise typer.Exit(2)


def check_tools(config: RunConfig, tasks: list[TaskConfig] | None = None) -> None:
    """Exit 2 when one of `tasks` (default: the config's) declares `tools = true` but the model's chat template has
    no tools (its tokenizer read from `[model] name_or_path` as the workers resolve it; only if one declares tools)."""
    from trajflow.cli.commands.tools import tools_refusal

    refusal = tools_refusal(config, config.tasks if tasks is None else tasks, say)
    if refusal:
        typer.secho(refusal, fg="red", err=True)
        raise typer.Exit(2)


def published(publish: Callable[[Any, Path], T]) -> T:
    """`publish(store, wheel_cache)` (a `trajflow.sandbox.user.submit` step) on the stack's object store (an
    `trajflow.infra.store.ObjectStore`, not imported here: the CLI's module level stays light) and wheel cache; a bad
    env definition exits 2 with its message."""
    from trajflow.infra.settings import load_settings
    from trajflow.infra.store import open_store_from
    from trajflow.sandbox.user.source import EnvSourceError

    settings = load_settings()
    try:
        return publish(open_store_from(settings), settings.cache_dir / "images")
    except EnvSourceError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None


def say(msg: str) -> None:
    typer.echo(msg, err=True)


def exit_now(code: int = 0) -> None:
    """End a command that used a Temporal client, skipping interpreter teardown.

    The client's Rust runtime threads can abort CPython's finalisation ("PyGILState_Release: thread state must
    be current", temporalio/sdk-python#300), turning a finished command into a crash; so flush and leave.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
