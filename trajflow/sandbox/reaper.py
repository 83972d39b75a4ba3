"""Removes orphaned sandbox containers: those whose owner process on this host is gone.

A container is an orphan when its `trajflow.owner_pid` names no running process, or a process whose start
time differs from `trajflow.owner_start` (the pid was reused), or it was labelled in an earlier boot.
Called when an env worker starts, before it starts sandboxes of its own.
Containers removed while it lists them (closed by their owners) are skipped, and so is one the engine fails to
remove (an error or a timeout of a busy engine): it is logged and left for the next reap, so reaping never keeps an
env worker from starting.
Limits: trusts the labels; containers whose owner labels are missing or unreadable are left alone (they are
not ours to judge), and so are those of owners in another pid namespace (another container's env worker on the
same engine) unless they carry this reaper's host name (`trajflow.sandbox.labels.owner_alive`).
"""

from __future__ import annotations

import logging
import shutil
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
    for container in client.containers.list(all=True, filters={"label": f"{labels.SANDBOX}=1"}, ignore_removed=True):
        container_labels = container.labels or {}
        if labels.owner_alive(container_labels, host_name) is not False:
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
