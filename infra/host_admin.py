"""What `trajflow status` and `trajflow down` do to the hosts `trajflow up --hosts` started (`trajflow.infra.hosts`): a
line per host container, and stopping exactly those containers, their sandboxes and their network."""

from __future__ import annotations

from trajflow.contracts import names
from trajflow.infra.hosts import LABEL_HOST, labelled_containers, layout_file, load_layout
from trajflow.infra.settings import Settings
from trajflow.infra.stack import Progress


def report(settings: Settings) -> list[str]:
    """One line per host container: host, state, container, its image, cpuset, memory and GPUs (as Docker was
    asked for them: the host's own device ids)."""
    layout = load_layout(settings)
    if layout is None:
        return []
    import docker

    client = docker.from_env()
    found = {c.labels.get(LABEL_HOST): c for c in labelled_containers(client, layout.prefix)}
    lines = []
    for host in layout.hosts:
        c = found.get(host)
        if c is None:
            lines.append(f"host {host:14} MISSING")
            continue
        config = c.attrs["HostConfig"]
        mem = config.get("Memory") or 0
        gpus = [i for r in config.get("DeviceRequests") or [] for i in r.get("DeviceIDs") or []]
        lines.append(
            f"host {host:14} {c.status:8} container {c.name}  image {c.attrs['Config']['Image']}  "
            f"cpus {config.get('CpusetCpus') or 'all'}  memory {f'{mem / 2**30:.1f}g' if mem else 'unlimited'}  "
            f"gpus {','.join(gpus) or 'none'}"
        )
    return lines


def down(settings: Settings, progress: Progress) -> int:
    """Stop and remove exactly the containers labelled with this layout's prefix, their sandboxes and the network."""
    layout = load_layout(settings)
    if layout is None:
        return 0
    import docker.errors

    client = docker.from_env()
    stopped = 0
    for c in labelled_containers(client, layout.prefix):
        c.stop(timeout=20)
        c.remove(force=True)
        stopped += 1
        progress(f"host {c.labels.get(LABEL_HOST)}: stopped and removed {c.name}")
    owners = {layout.container(h) for h in layout.hosts}
    for sb in client.containers.list(all=True, filters={"label": f"{names.LABEL_SANDBOX}=1"}, ignore_removed=True):
        if (sb.labels or {}).get(names.LABEL_OWNER_HOST) in owners:
            try:
                sb.remove(force=True)
            except docker.errors.NotFound:
                continue  # closed by its owner meanwhile
            progress(f"sandbox {sb.name}: removed (its env host is down)")
    for net in client.networks.list(names=[layout.network]):
        net.remove()
    layout_file(settings).unlink(missing_ok=True)
    return stopped
