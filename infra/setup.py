"""Preparing a machine for the stack: Docker reachable, sandbox images built, the policy model converted.

Idempotent and cached: a second call finds everything ready in about a second. Installing Docker itself is
the job of `scripts/bootstrap.sh` (it needs root and apt); here a missing engine is a clear error.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from contracts.config import RunConfig
from infra.settings import Settings


def docker_client():  # type: ignore[no-untyped-def]
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


def prepare(settings: Settings, config: RunConfig, say: Callable[[str], None]) -> None:
    from rl.models import resolve_model
    from sandbox.images import ensure_runtime_image

    for d in (settings.state_dir, settings.cache_dir, settings.log_dir, settings.run_dir, settings.sandbox_dir):
        d.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    image = ensure_runtime_image(docker_client(), settings.cache_dir / "images", progress=say)
    say(f"sandbox image {image} ready ({time.monotonic() - t0:.1f}s)")
    t0 = time.monotonic()
    path = resolve_model(config.model.name_or_path, settings.cache_dir / "models", progress=say)
    say(f"model {config.model.name_or_path} ready at {path} ({time.monotonic() - t0:.1f}s)")
