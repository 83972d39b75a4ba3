"""What `trajflow setup` and `trajflow up` prepare: the machine (`prepare_machine`: directories and Docker,
`trajflow.infra.setup`, then the sandbox images) and the policy model (`trajflow.rl.engines.load.prepare_model`:
converted once, plus the decode precision this host will use and why). Kept out of `infra/`, which never imports torch
or torch-using `rl` modules, and out of the CLI modules, so `--help` stays instant."""

from __future__ import annotations

import time
from collections.abc import Callable

from trajflow.contracts.config import RunConfig
from trajflow.infra.settings import Settings


def prepare_machine(settings: Settings, say: Callable[[str], None]) -> None:
    """Directories, Docker reachable, the sandbox's runtime image built (cached: about a second when it is)."""
    from trajflow.infra.setup import docker_client, prepare_dirs
    from trajflow.sandbox.images import ensure_runtime_image

    prepare_dirs(settings)
    t0 = time.monotonic()
    image = ensure_runtime_image(docker_client(), settings.cache_dir / "images", progress=say)
    say(f"sandbox image {image} ready ({time.monotonic() - t0:.1f}s)")


def prepare(settings: Settings, config: RunConfig, say: Callable[[str], None]) -> None:
    from trajflow.infra.placement import worker_env
    from trajflow.rl.engines.load import prepare_model

    prepare_machine(settings, say)
    # the decode worker's device, as its launcher will set it from the hardware section
    prepare_model(config.model, settings.cache_dir / "models", say, worker_env(config, "decode")["TRAJFLOW_DEVICE"])
