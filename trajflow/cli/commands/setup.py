"""What `trajflow setup` and `trajflow up` prepare: the machine (`trajflow.infra.setup.prepare`: directories, Docker,
sandbox images) and the policy model (`trajflow.rl.engines.load.prepare_model`: converted once, plus the decode
precision this host will use and why). Kept out of `infra/`, which never imports torch or torch-using `rl`
modules, and out of the CLI modules, so `--help` stays instant."""

from __future__ import annotations

from collections.abc import Callable

from trajflow.contracts.config import RunConfig
from trajflow.infra.settings import Settings


def prepare(settings: Settings, config: RunConfig, say: Callable[[str], None]) -> None:
    from trajflow.infra.placement import worker_env
    from trajflow.infra.setup import prepare as prepare_machine
    from trajflow.rl.engines.load import prepare_model

    prepare_machine(settings, config, say)
    # the decode worker's device, as its launcher will set it from the hardware section
    prepare_model(config.model, settings.cache_dir / "models", say, worker_env(config, "decode")["TRAJFLOW_DEVICE"])
