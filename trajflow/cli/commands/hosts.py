"""What `trajflow up --hosts` does and prints: the sandbox images and the worker image built here, then the hosts
layout (`trajflow.infra.hosts`), and the settings a user's own commands need to reach its store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trajflow.contracts.config import RunConfig
from trajflow.infra.settings import Settings


def up_hosts(settings: Settings, config: RunConfig, config_path: Path, say: Callable[[str], None]) -> int:
    """Start the layout; returns the exit code (1 with the reason on stderr when it could not start)."""
    from docker.errors import DockerException

    from trajflow.cli.commands.setup import prepare_machine
    from trajflow.infra import hosts
    from trajflow.infra.setup import docker_client
    from trajflow.sandbox.builder.worker_image import ensure_worker_image

    try:
        prepare_machine(settings, say)  # directories, Docker, the sandbox layers env hosts start from
        image = ensure_worker_image(docker_client(), settings.cache_dir / "images", say)
        gpu_hosts = [h.name for h in hosts.hosts_of(config) if h.gpu_ids()]
        cuda_image = None
        if gpu_hosts:  # their workers need the CUDA build of torch (several GB of wheels on the first build)
            say(f"hosts {', '.join(gpu_hosts)} are given GPUs: they run the CUDA worker image")
            cuda_image = ensure_worker_image(docker_client(), settings.cache_dir / "images", say, cuda=True)
        layout = hosts.up(settings, config, config_path.read_text(), image, say, cuda_image=cuda_image)
    except (RuntimeError, TimeoutError, ValueError, DockerException) as e:
        say(f"trajflow up --hosts failed: {e}")
        return 1
    print(
        f"up: {len(layout.hosts)} hosts ({', '.join(layout.hosts)}) on network {layout.network}, image {layout.image}"
        + (f" (CUDA image {layout.cuda_image} on the hosts given GPUs)" if layout.cuda_image else "")
    )
    print(f"Temporal Web UI at http://127.0.0.1:{settings.temporal_ui_port}  (stop with `trajflow down`)")
    if layout.s3_endpoint_url is not None:
        print("the store is S3 (moto); for `trajflow train` and other commands on this machine:")
        print(
            f"  export TRAJFLOW_STORE_URL={layout.store_url} TRAJFLOW_S3_ENDPOINT_URL=http://127.0.0.1:{settings.hosts_s3_port}"
        )
        keys = " ".join(f"{k}={v}" for k, v in hosts.S3_KEYS.items())
        print(f"  export {keys}")
    return 0
