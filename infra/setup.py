"""Preparing a machine for the stack: state directories, Docker reachable, sandbox images built.

Idempotent and cached: a second call finds everything ready in about a second. Installing Docker itself is
the job of `scripts/bootstrap.sh` (it needs root and apt); here a missing engine is a clear error. The policy
model is not prepared here (infra never imports torch): `trajflow.rl.engines.load.prepare_model` does it, called by the
commands after `prepare`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from trajflow.contracts.config import RunConfig
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


def prepare(settings: Settings, config: RunConfig, say: Callable[[str], None]) -> None:
    from trajflow.sandbox.images import ensure_runtime_image

    for d in (settings.state_dir, settings.cache_dir, settings.log_dir, settings.run_dir, settings.sandbox_dir):
        d.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    image = ensure_runtime_image(docker_client(), settings.cache_dir / "images", progress=say)
    say(f"sandbox image {image} ready ({time.monotonic() - t0:.1f}s)")
