"""Preparing a machine for the stack: state directories, Docker reachable.

Idempotent: a second call finds everything ready at once. Installing Docker itself is the job of
`scripts/bootstrap.sh` (it needs root and apt); here a missing engine is a clear error. The sandbox images and the
policy model are not prepared here (infra imports neither the sandbox nor torch): `trajflow setup` and `trajflow up`
build them after this (`trajflow.cli.commands.setup`).
"""

from __future__ import annotations

from trajflow.infra.settings import Settings


def docker_client():
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env()
        client.ping()
    except DockerException as e:
        raise SystemExit(
            f"Docker is not reachable ({e}). Start the engine (as root: `scripts/bootstrap.sh` installs and starts it) "
            "or point DOCKER_HOST at one."
        ) from None
    return client


def prepare_dirs(settings: Settings) -> None:
    """The stack's state, cache, log, run and sandbox directories."""
    for d in (settings.state_dir, settings.cache_dir, settings.log_dir, settings.run_dir, settings.sandbox_dir):
        d.mkdir(parents=True, exist_ok=True)
