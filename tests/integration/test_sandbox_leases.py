"""Sandbox leases end to end: a trajectory whose decode is held keeps its idle sandbox past the sweep's hard cap (its
run waits for a model call, so the sweep renews the lease); terminated mid-episode with the `temporal` CLI, it loses
the sandbox to the env worker's sweep within twice the lease, while that env worker (a real `trajflow worker env`
process, on the real dev server and Docker) keeps running and serves the next trajectory. Decode, reward and the
workflows run in this process (a gated scripted policy holds the episode between two turns)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
import uuid
from typing import TYPE_CHECKING, cast

import docker.errors
import pytest

from tests.conftest import ROOT, stack_state_dir, wait_for
from tests.integration.test_trajectory import OUT_OF_RANGE, GatedEngine
from trajflow.contracts import names
from trajflow.contracts.trajectory import StagePools, TrajectoryRequest, TrajectoryStatus
from trajflow.sandbox import labels
from trajflow.sandbox.leases import cap_for

if TYPE_CHECKING:
    from trajflow.rl.engines.base import Engine

pytestmark = pytest.mark.integration

LEASE_S = 4.0
CAP_S = cap_for(LEASE_S)
"""Past it an idle sandbox of a running trajectory is removed, unless its trajectory waits for decode."""


@pytest.fixture()
def scripted(tiny_model):
    from transformers import AutoTokenizer

    from trajflow.rl.engines.scripted import ScriptedEngine

    return ScriptedEngine(AutoTokenizer.from_pretrained(tiny_model), OUT_OF_RANGE)


def sandbox_containers(docker_client, **wanted: str) -> list:
    filters = [f"{labels.SANDBOX}=1", *(f"{key}={value}" for key, value in wanted.items())]
    return docker_client.containers.list(all=True, filters={"label": filters}, ignore_removed=True)


async def test_a_terminated_trajectory_loses_its_sandbox_within_two_leases_and_the_env_worker_serves_on(
    temporal_env, reward_service, store, cache_dir, docker_client, scripted
) -> None:
    from trajflow.client import run_trajectory, start_trajectory
    from trajflow.infra.temporal import temporal_binary
    from trajflow.rewards.client import RewardClient
    from trajflow.workers.decode import decode_workers
    from trajflow.workers.orchestrator import orchestrator_workers
    from trajflow.workers.reward import reward_workers

    tag = uuid.uuid4().hex[:8]
    pool, queue = f"t{tag}", f"trajflow-test-{tag}"
    address = temporal_env.client.service_client.config.target_host
    state_dir = stack_state_dir(cache_dir, "tf-lease-")
    log_path = state_dir / "env.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "TRAJFLOW_STATE_DIR": str(state_dir),
        "TRAJFLOW_TEMPORAL_ADDRESS": address,
        "TRAJFLOW_SANDBOX_LEASE_S": str(LEASE_S),
        "TRAJFLOW_SANDBOX_WARM_POOL": "1",
        "TRAJFLOW_TRACES": "false",
    }
    with log_path.open("w") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "trajflow", "worker", "env", "--pool", pool],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    engine = GatedEngine(scripted, gate_at=1)  # holds the second turn's decode: the sandbox sits idle
    reward_client = RewardClient(reward_service, timeout_s=10)
    client = temporal_env.client
    workers = orchestrator_workers(client, queue)
    workers += decode_workers(client, cast("Engine", engine), store, [pool], f"w{tag}")  # a wrapper of one
    workers += reward_workers(client, reward_client, store, [pool])
    tasks = [asyncio.create_task(w.run()) for w in workers]

    def request(**fields) -> TrajectoryRequest:
        return TrajectoryRequest(pools=StagePools(decode=pool, env=pool, reward=pool), **fields)

    try:
        wait_for(
            lambda: worker.poll() is None and log_path.read_text().count("polling") >= 2,
            120,
            what=f"the env worker to poll (log: {log_path})",
        )
        env_id, kwargs = "game:GuessTheNumber-v0-hard", {"max_turns": 6}
        workflow_id = f"lease-{tag}"
        handle = await start_trajectory(
            request(env_id=env_id, seed=5, env_kwargs=kwargs, max_turns=6),
            client=client,
            task_queue=queue,
            workflow_id=workflow_id,
        )
        await asyncio.wait_for(engine.reached.wait(), 120)
        sandbox_id = (await handle.query(names.QUERY_PROGRESS))["sandbox"]
        (container,) = sandbox_containers(docker_client, **{labels.SANDBOX_ID: sandbox_id})
        assert container.status == "running"
        assert container.labels[labels.OWNER_PID] == str(worker.pid)
        # decode held past the cap: the sandbox stays, its lease renewed while the run waits for the model call
        await asyncio.sleep(CAP_S + 3)
        try:
            container.reload()
        except docker.errors.NotFound:
            pytest.fail(f"sandbox {sandbox_id} was removed while its trajectory waited for decode")
        assert container.status == "running" and f"removed sandbox {sandbox_id}" not in log_path.read_text()

        terminate = [temporal_binary(), "workflow", "terminate", "--workflow-id", workflow_id, "--address", address]
        done = subprocess.run([*terminate, "--reason", "test"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        terminated = time.monotonic()
        # the sweep's bound is 1.5 leases (its last renewal is dated before the terminate, its rounds wait at most a
        # quarter lease for answers: workers/sandbox_sweep.py) plus Docker's removal; the rest is slack for a busy CPU
        wait_for(
            lambda: not sandbox_containers(docker_client, **{labels.SANDBOX_ID: sandbox_id}),
            2 * LEASE_S,
            interval_s=0.2,
            what=f"sandbox {sandbox_id} of the terminated trajectory to be removed",
        )
        print(f"sandbox removed {time.monotonic() - terminated:.1f}s after the terminate")
        assert worker.poll() is None, "the env worker stopped"
        assert f"removed sandbox {sandbox_id} (workflow {workflow_id}" in log_path.read_text()

        engine.released.set()  # the terminated run's decode returns into nothing
        result = await run_trajectory(
            request(env_id=env_id, seed=6, env_kwargs={"max_turns": 2}, max_turns=2), client=client, task_queue=queue
        )
        assert result.status is TrajectoryStatus.COMPLETED, result.error
        assert result.env_recoveries == 0 and result.turns == 2
        assert worker.poll() is None
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        await asyncio.gather(*(w.shutdown() for w in workers), return_exceptions=True)
        for t in tasks:
            t.cancel()
        await reward_client.close()
        left = sandbox_containers(docker_client, **{labels.OWNER_PID: str(worker.pid)})
        for box in left:
            box.remove(force=True)
        shutil.rmtree(state_dir, ignore_errors=True)
    assert not left, "the env worker left sandboxes behind when it stopped"


def test_another_hosts_dead_worker_is_told_by_its_container(docker_client) -> None:
    """An env worker in a container (an env host of `up --hosts`) labels its container; a reaper in another pid
    namespace cannot judge that worker's pid, but removes its sandboxes once that container stops or restarts."""
    from trajflow.sandbox.images import base_image_tag
    from trajflow.sandbox.reaper import reap_orphans

    image = base_image_tag()
    # what the worker's own container shows it: the engine's id of that container, in its mounts
    probe = docker_client.containers.run(image, ["cat", "/proc/self/mountinfo"], detach=True, network_mode="none")
    try:
        probe.wait(timeout=60)
        assert labels.container_ids_in_mountinfo(probe.logs().decode()) == [probe.id]
    finally:
        probe.remove(force=True)

    host = docker_client.containers.run(image, ["sleep", "300"], detach=True, network_mode="none")
    boxes = []
    try:
        host.reload()
        owner = labels.OwnerContainer(host.id, host.attrs["State"]["StartedAt"])
        theirs = {
            **labels.owner_labels("other-worker", uuid.uuid4().hex[:12], "other-host", owner),
            labels.OWNER_PIDNS: "pid:[4026532999]",  # another namespace: its pid says nothing here
        }
        boxes.append(docker_client.containers.run(image, ["sleep", "300"], detach=True, labels=theirs))
        assert boxes[0].id not in reap_orphans(docker_client, host_name="this-host")  # its host runs: not ours
        host.restart(timeout=0)  # a restarted host has none of its old processes
        assert _reaped(docker_client, boxes[0].id, reap_orphans(docker_client, host_name="this-host"))
        host.reload()
        restarted = labels.OwnerContainer(host.id, host.attrs["State"]["StartedAt"])
        boxes.append(
            docker_client.containers.run(
                image,
                ["sleep", "300"],
                detach=True,
                labels={**theirs, **labels.owner_labels("w", "s2", "h", restarted)},
            )
        )
        boxes[1].reload()
        assert boxes[1].labels[labels.OWNER_PID] == str(os.getpid())  # this process: alive in this namespace
        host.stop(timeout=0)
        other = {**boxes[1].labels, labels.OWNER_PIDNS: "pid:[4026532999]"}
        boxes.append(docker_client.containers.run(image, ["sleep", "300"], detach=True, labels=other))
        reaped = reap_orphans(docker_client, host_name="this-host")
        assert _reaped(docker_client, boxes[2].id, reaped)  # its host container stopped
        assert boxes[1].id not in reaped  # same namespace, live pid: the pid rule comes first
    finally:
        for box in [*boxes, host]:
            try:
                box.remove(force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as e:
                if e.status_code != 409:  # 409: a reaper is removing it right now
                    raise


def _reaped(client: docker.DockerClient, container_id: str, reaped: list[str]) -> bool:
    """Whether this reap removed the container, or another reaper on the engine did meanwhile: an env worker's sweep
    left running by another test applies the same owner-container rule, and this reap then skips the container
    (409) or no longer lists it. Either way the container must be gone (within 10 s, else TimeoutError)."""
    return container_id in reaped or wait_for(
        lambda: _gone(client, container_id), timeout_s=10, what=f"container {container_id[:12]} to be removed"
    )


def _gone(client: docker.DockerClient, container_id: str) -> bool:
    try:
        client.api.inspect_container(container_id)
    except docker.errors.NotFound:
        return True
    return False
