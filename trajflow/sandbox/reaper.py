"""Removes orphaned sandbox containers: those whose owner process is gone.

A container is an orphan when its `trajflow.owner_pid` names no running process, or a process whose start
time differs from `trajflow.owner_start` (the pid was reused), or it was labelled in an earlier boot; or, for an
owner that ran in a container on this engine (`trajflow.owner_container`), when that container is gone, stopped or
was restarted since (another host's dead env worker under `trajflow up --hosts`).
Run by every env worker's periodic sweep (`workers/sandbox_sweep.py`), the first time before it starts sandboxes of its
own. Containers removed while it lists them (closed by their owners) are skipped, and so is one the engine fails
to remove (an error or a timeout of a busy engine): it is logged and left for the next round, so reaping never
keeps an env worker from starting.
Limits: trusts the labels; containers whose owner labels are missing or unreadable are left alone (they are
not ours to judge), and so are those of owners in another pid namespace (another container's env worker on the
same engine) unless they carry this reaper's host name (`trajflow.sandbox.labels.owner_alive`) or the owner's
container says it is gone.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from pathlib import Path

import docker
import docker.errors
import requests

from trajflow.sandbox import labels

log = logging.getLogger("trajflow.sandbox.reaper")


def reap_orphans(client: docker.DockerClient, runtime_dir: Path | None = None, host_name: str = "") -> list[str]:
    """Force-remove orphaned sandbox containers; returns their container ids.

    With `runtime_dir`, each reaped sandbox's host directory (`runtime_dir/<sandbox id>`) is removed too.
    `host_name`: the reaper's host (`TRAJFLOW_HOST_NAME`), so it also reaps what an earlier run of itself left.
    """
    reaped: list[str] = []
    containers: dict[str, bool] = {}  # owner container id -> still the owner's (asked once per call)
    for container in client.containers.list(all=True, filters={"label": f"{labels.SANDBOX}=1"}, ignore_removed=True):
        container_labels = container.labels or {}
        alive = labels.owner_alive(container_labels, host_name)
        if alive is None:
            alive = _owner_container_alive(client, container_labels, containers)
        if alive is not False:
            continue
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            continue  # removed by someone else meanwhile
        except docker.errors.APIError as e:
            if e.status_code != 409:  # 409: another reaper is removing it right now
                log.warning("could not remove orphaned sandbox %s (left for the next reap): %s", container.name, e)
            continue
        except requests.RequestException as e:  # the engine did not answer in the client's timeout
            log.warning("could not remove orphaned sandbox %s (left for the next reap): %r", container.name, e)
            continue
        assert container.id is not None  # docker's stubs allow a model without an id; a listed container has one
        reaped.append(container.id)
        sandbox_id = container_labels.get(labels.SANDBOX_ID, "")
        if runtime_dir is not None and sandbox_id.isalnum():
            shutil.rmtree(Path(runtime_dir) / sandbox_id, ignore_errors=True)
    return reaped


def _owner_container_alive(
    client: docker.DockerClient, container_labels: Mapping[str, str], seen: dict[str, bool]
) -> bool | None:
    """False when the labels name an owner container that is gone, stopped or restarted since; None otherwise."""
    owner = container_labels.get(labels.OWNER_CONTAINER, "")
    if not owner:
        return None
    if owner not in seen:
        seen[owner] = _container_started_at(client, owner) == container_labels.get(labels.OWNER_CONTAINER_STARTED)
    return None if seen[owner] else False


def _container_started_at(client: docker.DockerClient, container_id: str) -> str | None:
    """The container's `State.StartedAt` while it runs; None when it is gone or not running."""
    try:
        state = client.api.inspect_container(container_id)["State"]
    except docker.errors.NotFound:
        return None
    return str(state.get("StartedAt")) if state.get("Running") else None


def own_container(
    client: docker.DockerClient, mountinfo: Path = Path("/proc/self/mountinfo")
) -> labels.OwnerContainer | None:
    """The running container on this engine that this process runs in, or None (not in a container, or in one of
    another engine: its id is then unknown to this one)."""
    try:
        ids = labels.container_ids_in_mountinfo(mountinfo.read_text())
    except OSError:
        return None
    if len(ids) != 1:
        return None  # not in a container, or files of several mounted in: no sure answer
    started = _container_started_at(client, ids[0])
    return labels.OwnerContainer(ids[0], started) if started else None
