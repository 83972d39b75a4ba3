"""Two decode replicas of one pool, as a user runs them: `trajflow up -c` with `[pools] decode_replicas = {default =
2}` (tiny model), a training run started from a client, one replica killed with SIGKILL mid-run.

Checks that `up` started two decode processes polling the one queue, that both answered turns (each turn's record names
its decode worker) and both served a version the trainer published after they started, that Prometheus scraped each
with its own `replica` label, and that after the kill those turns it cut off were retried on the survivor and the run
completed every step with nothing lost, nothing consumed twice and no infra failure (the audit of `trajflow chaos`),
the versions published after the kill served by the survivor alone. Which turns the kill cuts off: the victim is
frozen (SIGSTOP) once turns are in flight on it (its engine waits `batch_wait_ms` before each batch), and those still
started on it a moment later, which can no longer finish, are the ones; were none, it is thawed and the test tries
again (a batch seen in flight can finish all at once just before the freeze). Not checked: learning (the policy is
random)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import CliStack, started_cli_stack, wait_for
from trajflow.contracts import metrics, names
from trajflow.contracts.records import TrajectoryRecord
from trajflow.infra.monitoring import replica_name
from trajflow.infra.processes import ProcessTable, kill
from trajflow.infra.settings import Settings
from trajflow.infra.store import open_store_from
from trajflow.observability import prometheus

pytestmark = pytest.mark.integration

CONFIG = """
[model]
name_or_path = "tiny"
batch_wait_ms = 400  # each turn waits in its engine a while: the killed replica has turns in flight

[pools]
decode_replicas = { default = 2 }

[[tasks]]
name = "guess-the-number"
env_id = "game:GuessTheNumber-v0-easy"
max_turns = 4
sampling = { temperature = 1.0, max_new_tokens = 16 }

[train]
steps = 8
batch_size = 8
group_size = 4
alpha = 1
eval = { episodes = 0 }
"""
STEPS = 8


@pytest.fixture(scope="module")
def replicas_stack(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    config = tmp_path_factory.mktemp("replicas") / "replicas.toml"
    config.write_text(CONFIG)
    with started_cli_stack(cache_dir, config, prefix="tf-replicas-") as stack:
        yield stack


def turns_by_pid(stack: CliStack, run_id: str) -> dict[int, list[int]]:
    """The policy version of every turn of the run's finished trajectories, by the pid of the decode worker that
    answered it (a worker id is `host-pid-random`)."""
    out: dict[int, list[int]] = defaultdict(list)
    for path in (stack.state_dir / "store" / "trajectories").glob(f"{run_id}-g*/*/trajectory.json"):
        for turn in TrajectoryRecord.model_validate_json(path.read_text()).turns:
            out[int(turn.decode_worker.rsplit("-", 2)[1])].append(turn.policy_version)
    return out


def test_two_replicas_serve_one_pool_and_killing_one_mid_run_loses_nothing(replicas_stack: CliStack) -> None:
    stack = replicas_stack
    settings = Settings(state_dir=stack.state_dir, temporal_address=stack.env["TRAJFLOW_TEMPORAL_ADDRESS"])
    procs = {r.name: r for r in ProcessTable(settings.run_dir).load()}
    first, second = procs[replica_name(0)], procs[replica_name(1)]
    listed = stack.trajflow("status").stdout
    assert f"queue {names.decode_queue('default'):40} pollers 2" in listed, listed
    assert f"{'decode-1':15} up" in listed, listed
    result = asyncio.run(train_and_kill(stack, settings, second.pid, lambda: kill(second)))

    before, after = result["before_kill"], result["after_kill"]
    # both replicas answered turns, and each served a version published while it ran
    assert before.get(first.pid) and before.get(second.pid), before
    assert max(before[second.pid]) >= 1 and max(after[first.pid]) >= 1, (before, after)
    # the versions published after the kill were served by the survivor alone
    later = {pid: [v for v in versions if v > result["version_at_kill"]] for pid, versions in after.items()}
    assert later.get(first.pid) and not later.get(second.pid), later
    assert set(after) <= {first.pid, second.pid}, after

    # the turns cut off on the killed replica were retried on the survivor, and their trajectories completed
    assert result["retried_by"] and all(i.startswith(f"{first.pid}@") for i in result["retried_by"]), result
    counts = result["counts"]
    assert counts["lost"] == 0 and counts["consumed_twice"] == 0 and counts["infra_failures_scored"] == 0, counts
    assert counts["infra_failed"] == 0 and counts["failed"] == 0, counts
    assert counts["steps_completed"] == counts["steps_configured"] == STEPS, counts
    assert counts["consumed"] == STEPS * 8, counts

    # Prometheus scraped each replica under its own label, the killed one until it died
    url = prometheus.url(int(stack.env["TRAJFLOW_PROMETHEUS_PORT"]))
    promql = f'max by (replica) (max_over_time({metrics.DECODE_TOKENS.exposed}{{component="decode"}}[30m]))'
    tokens = {r["metric"]["replica"]: float(r["value"][1]) for r in prometheus.query(url, promql)}
    assert set(tokens) == {"0", "1"} and min(tokens.values()) > 0, tokens


async def train_and_kill(stack: CliStack, settings: Settings, victim_pid: int, kill_victim) -> dict:
    """Start a training run, kill the victim replica once it has served a turn at a published version (v1 or
    later), wait for the run to end and audit its records."""
    from trajflow.client import start_training, training_progress
    from trajflow.contracts.config import load_run_config
    from trajflow.infra.temporal import connect
    from trajflow.lab.chaos.audit import audit, collect

    client = await connect(settings)
    run = load_run_config(stack.config).training_run()
    handle = await start_training(run, run_id="replicas-run", client=client)

    def victim_served_a_new_version() -> bool:
        return max(turns_by_pid(stack, handle.id).get(victim_pid, [0])) >= 1

    await asyncio.to_thread(wait_for, victim_served_a_new_version, 300, 1.0, "the second replica to serve v1")
    interrupted = await freeze_with_turns_in_flight(client, handle.id, victim_pid)
    kill_victim()
    killed_at = time.monotonic()
    # read after the kill: every version newer than this was published once the victim was gone
    version_at_kill = (await training_progress(handle)).version
    assert version_at_kill < STEPS - 1, f"the run is almost over (v{version_at_kill}): nothing left to kill mid-run"
    before_kill = dict(turns_by_pid(stack, handle.id))
    result = await asyncio.wait_for(handle.result(), timeout=600)
    progress = await training_progress(handle)
    query = f"TrajflowRun = '{handle.id}' AND ExecutionStatus = 'Running'"
    deadline = time.monotonic() + 120
    while (await client.count_workflows(query)).count and time.monotonic() < deadline:
        await asyncio.sleep(1)
    store = open_store_from(settings)
    records = await collect(client, store, handle.id, result.version, run.steps, progress.counters.started)
    after = turns_by_pid(stack, handle.id)
    print(f"\nkilled at v{version_at_kill}; run took {time.monotonic() - killed_at:.0f}s more; turns by pid {after}")
    return {
        "interrupted": interrupted,
        "retried_by": [who for wid in interrupted for who in await generate_retries(client, wid)],
        "counts": audit(records).model_dump(),
        "version_at_kill": version_at_kill,
        "before_kill": before_kill,
        "after_kill": {pid: v for pid, v in after.items()},
    }


async def freeze_with_turns_in_flight(client, run_id: str, pid: int, timeout_s: float = 120) -> list[str]:
    """Stop the process group of `pid` (SIGSTOP) at a moment when turns of the run are started on it, and return
    those: frozen, it can finish none of them. A second after the freeze lets a result it sent just before reach
    the server; if every turn seen had finished by then, it is thawed and tried again."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if seen := await turns_in_flight_on(client, run_id, pid):
            os.killpg(pid, signal.SIGSTOP)
            await asyncio.sleep(1.0)
            frozen = await turns_in_flight_on(client, run_id, pid)
            print(f"froze the worker {pid} with {len(seen)} turns seen in flight, {len(frozen)} still started")
            if frozen:
                return frozen
            os.killpg(pid, signal.SIGCONT)
    raise AssertionError(f"no turn in flight on the worker {pid} at a freeze for {timeout_s:.0f} s")


async def turns_in_flight_on(client, run_id: str, pid: int) -> list[str]:
    """The running trajectories of the run whose `llm.generate` has started on the worker process `pid` and not
    finished (Temporal's pending activity, by the worker's identity `pid@host`)."""
    from temporalio.api.enums.v1 import PendingActivityState

    started = PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
    found = []
    async for wf in client.list_workflows(f"TrajflowRun = '{run_id}' AND ExecutionStatus = 'Running'"):
        for act in (await client.get_workflow_handle(wf.id).describe()).raw_description.pending_activities:
            if act.activity_type.name == names.LLM_GENERATE and act.state == started:
                if act.last_worker_identity.startswith(f"{pid}@"):
                    found.append(wf.id)
    return found


async def generate_retries(client, workflow_id: str) -> list[str]:
    """The worker identities of the `llm.generate` attempts of a trajectory that ran as a retry (attempt 2 or later;
    Temporal records the started event of an activity's last attempt only)."""
    kinds: dict[int, str] = {}
    out = []
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            kinds[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        if event.HasField("activity_task_started_event_attributes"):
            attrs = event.activity_task_started_event_attributes
            if attrs.attempt >= 2 and kinds.get(attrs.scheduled_event_id) == names.LLM_GENERATE:
                out.append(attrs.identity)
    return out
