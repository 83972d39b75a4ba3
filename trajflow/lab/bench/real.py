"""`trajflow bench real`: sync against asynchrony on the real workload — the run config's model (SmolLM2 by
default), its env in Docker sandboxes, the real trainer — measured in one run, the same steps for each mode.

The stack must already run (`trajflow up`, or `trajflow up --hosts` for pools on their own hosts with decode and
the trainer on disjoint CPU sets): the bench starts nothing, it trains. Modes, in order: sync (α = 0 with the
batch barrier), then each α given (1 and 2 by default), each a TrainingWorkflow of `steps` steps from the same
initial policy (a fresh run id per mode: each starts at version 0) and the same seeds. The figures
(`trajflow.lab.bench.real_report`) come from what Temporal recorded: step end times, and the spans of the decode and
trainer activities, so they hold whatever the layout.

Limits: the modes run one after another on the same stack, so a slow drift of the machine (another tenant on a
shared CPU) biases them; the first step of each mode (model loading, pipeline fill) is left out of every figure.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client

from trajflow.contracts import names
from trajflow.contracts.config import RunConfig
from trajflow.contracts.training import TrainingResult, TrainingRunConfig
from trajflow.lab.bench.real_report import ModeFigures, Span, machine, mode_figures, render, summary

Say = Callable[[str], None]


@dataclass(frozen=True)
class RealPlan:
    steps: int = 6
    """Optimizer steps per mode (the first is left out of the figures)."""
    alphas: tuple[int, ...] = (1, 2)
    batch_size: int | None = None
    """Trajectories per step; None: the config's [train] batch_size."""
    group_size: int | None = None
    label: str = "real"

    def run_config(self, config: RunConfig, alpha: int) -> TrainingRunConfig:
        """The config's training run with this plan's steps, α (0: sync with the barrier) and batch shape."""
        fields: dict[str, object] = {"steps": self.steps, "alpha": alpha, "sync": alpha == 0}
        if self.batch_size is not None:
            fields["batch_size"] = self.batch_size
        if self.group_size is not None:
            fields["group_size"] = self.group_size
        return TrainingRunConfig.model_validate({**config.training_run().model_dump(), **fields})


def quick_plan() -> RealPlan:
    """4 steps of 8 trajectories (groups of 4) per mode: 3 steady intervals per mode, about 18 minutes for the three
    modes on a 2-core AVX2 CPU with SmolLM2 (float32; measured on the hosts layout), 5 on a 2-core CPU with native
    bf16 (the embedded default)."""
    return RealPlan(steps=4, batch_size=8, group_size=4, label="quick")


_CLOSED = {f"activity_task_{k}_event_attributes" for k in ("completed", "failed", "timed_out", "canceled")}


async def activity_spans(client: Client, workflow_id: str, activity: str) -> list[Span]:
    """[started, closed] wall-clock spans of every attempt of `activity` in every run of `workflow_id`."""
    scheduled: dict[int, str] = {}
    started: dict[int, float] = {}
    spans: list[Span] = []
    runs = [wf.run_id async for wf in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    for run_id in runs:
        scheduled.clear()
        started.clear()
        async for ev in client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history_events():
            t = ev.event_time.ToDatetime().timestamp()
            which = ev.WhichOneof("attributes")
            if which == "activity_task_scheduled_event_attributes":
                scheduled[ev.event_id] = ev.activity_task_scheduled_event_attributes.activity_type.name
            elif which == "activity_task_started_event_attributes":
                started[ev.activity_task_started_event_attributes.scheduled_event_id] = t
            elif which in _CLOSED:
                sched = getattr(ev, which).scheduled_event_id
                if scheduled.get(sched) == activity and sched in started:
                    spans.append((started[sched], t))
    return spans


async def run_spans(client: Client, run_id: str) -> dict[str, list[Span]]:
    """Decode spans of the run's trajectories and trainer spans of the run itself."""
    query = f"WorkflowType = '{names.TRAJECTORY_WORKFLOW}' AND TrajflowRun = '{run_id}'"
    ids = [wf.id async for wf in client.list_workflows(query)]
    decode: list[Span] = []
    for chunk in range(0, len(ids), 16):
        parts = await asyncio.gather(*(activity_spans(client, i, names.LLM_GENERATE) for i in ids[chunk : chunk + 16]))
        decode += [s for p in parts for s in p]
    return {"decode": decode, "trainer": await activity_spans(client, run_id, names.TRAIN_STEP)}


async def _end_leftovers(client: Client, run_id: str) -> int:
    """Terminate the run's trajectories still running (admitted during the last step, never used), so they do
    not load the next mode."""
    query = f"WorkflowType = '{names.TRAJECTORY_WORKFLOW}' AND TrajflowRun = '{run_id}' AND ExecutionStatus = 'Running'"
    ended = 0
    async for wf in client.list_workflows(query):
        try:
            await client.get_workflow_handle(wf.id).terminate("bench real: the mode that started it has ended")
            ended += 1
        except Exception:
            pass
    return ended


def _stack_processes() -> dict[str, int]:
    """Name -> pid of the live processes `trajflow up` started on this machine (none for `up --hosts`' containers,
    whose CPU counts as "other")."""
    from trajflow.infra.processes import ProcessTable, is_alive
    from trajflow.infra.settings import load_settings

    return {r.name: r.pid for r in ProcessTable(load_settings().run_dir).load() if is_alive(r)}


async def run_mode(client: Client, config: RunConfig, plan: RealPlan, alpha: int, say: Say) -> ModeFigures:
    from trajflow.client import start_training, training_progress
    from trajflow.lab.bench import cpu_use

    label = "sync" if alpha == 0 else f"alpha{alpha}"
    run_id = f"bench-{plan.label}-{label}-{int(time.time())}"
    cfg = plan.run_config(config, alpha)
    say(f"{label}: {plan.steps} steps of {cfg.batch_size} trajectories (run {run_id})")
    processes = _stack_processes()
    start, t0 = time.time(), time.monotonic()
    handle = await start_training(cfg, run_id=run_id, client=client)
    waiter = asyncio.ensure_future(handle.result())
    seen, first = 0, None
    while not waiter.done():
        await asyncio.wait({waiter}, timeout=1.0)
        if not waiter.done():
            version = (await training_progress(handle)).version
            if version > seen:
                seen = version
                if first is None:  # the steady window starts at step 1's end (seen within a second)
                    first = cpu_use.take(processes)
                say(f"  {label}: step {version}/{plan.steps} at {time.monotonic() - t0:.0f} s")
    result: TrainingResult = waiter.result()
    wall = time.monotonic() - t0
    last = cpu_use.take(processes)
    cores = cpu_use.cores_used(first, last) if first is not None else {}
    waiting = cpu_use.cores_waiting(first, last) if first is not None else {}
    await _end_leftovers(client, run_id)
    spans = await run_spans(client, run_id)
    figures = mode_figures(
        label,
        alpha,
        [h.time_s for h in result.history],
        [h.train_s for h in result.history],
        cfg.batch_size,
        spans,
        start,
        wall,
        result.counters.model_dump(),
        [_train_parts(h.metrics) for h in result.history],
        cores,
        waiting,
    )
    figures.sandboxes_started = sandbox_starts(start, time.time())
    return figures


def sandbox_starts(since: float, until: float, owner: str | None = None) -> int | None:
    """Sandbox containers the local Docker engine started between two wall-clock times (its event log), of any
    worker or of `owner`'s; None when the engine cannot be asked."""
    import docker
    import docker.errors

    from trajflow.sandbox import labels

    try:
        client = docker.from_env()
        wanted = [f"{labels.SANDBOX}=1", *([f"{labels.OWNER}={owner}"] if owner else [])]
        filters = {"type": "container", "event": "start", "label": wanted}
        return sum(1 for _ in client.events(since=int(since), until=int(until) + 1, filters=filters, decode=True))
    except (docker.errors.DockerException, OSError):
        return None


ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
"""Variables that cap the vector ISA torch's kernels use (ATen's dispatch; oneDNN's matmuls): set on the stack, a
CPU runs the kernels of an older one (e.g. `avx2` on a CPU with AVX-512)."""


def _environ_of(name: str) -> dict[str, str] | None:
    """The environment the embedded stack's process `name` was started with; None where it cannot be read (no
    such process here: `up --hosts`)."""
    pid = _stack_processes().get(name)
    if pid is None:
        return None
    try:
        return dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
    except OSError:
        return None


def env_worker_reuse() -> int | None:
    """`TRAJFLOW_SANDBOX_REUSE` as the embedded stack's env worker was started with (its default where unset); None
    where it cannot be read (`_environ_of`)."""
    from trajflow.infra.settings import Settings

    environ = _environ_of("env")
    if environ is None:
        return None
    value = environ.get("TRAJFLOW_SANDBOX_REUSE")
    return int(value) if value and value.isdigit() else Settings.model_fields["sandbox_reuse"].default


def kernels(config: RunConfig) -> dict[str, object]:
    """What decides the kernels decode and the trainer run: the config's decode dtype and trainer autocast ("auto":
    native bf16 decides, see `trajflow.rl.precision`) and any `ISA_CAPS` the embedded decode and trainer processes
    were started with (None where they cannot be read)."""
    caps = {name: _environ_of(name) for name in ("decode", "trainer")}
    return {
        "decode_dtype": config.model.dtype,
        "trainer_autocast": config.train.trainer.autocast,
        "isa_caps": {
            name: None if env is None else {k: env[k] for k in ISA_CAPS if k in env} for name, env in caps.items()
        },
    }


def _train_parts(metrics: dict[str, float]) -> dict[str, float]:
    """What a step's trainer metrics say of its time: its updates (`compute_s`), its reads (`load_s`), and the
    tokens they trained on (`tokens`: loss tokens only, a rough size of the step; its prompts cost compute too)."""
    return {
        "compute_s": metrics.get("seconds", 0.0),
        "load_s": metrics.get("load_s", 0.0),
        "tokens": metrics.get("tokens", 0.0),
    }


async def run_bench(config: RunConfig, plan: RealPlan, say: Say) -> dict[str, object]:
    from trajflow.infra.settings import load_settings
    from trajflow.infra.temporal import wait_until_reachable

    settings = load_settings()
    client = await wait_until_reachable(settings, timeout_s=10)
    sync = await run_mode(client, config, plan, 0, say)
    modes = [await run_mode(client, config, plan, a, say) for a in plan.alphas]
    hosts = (settings.run_dir / "hosts.json").exists()  # what `trajflow up --hosts` leaves
    where = {
        **machine(),
        "layout": "hosts" if hosts else "embedded",
        "sandbox_reuse": env_worker_reuse(),
        "kernels": kernels(config),
        "hardware": [h.model_dump(exclude_defaults=True) for h in config.hardware.hosts],
    }
    return summary(sync, modes, where)


def main(config: RunConfig, plan: RealPlan, json_path: Path | None, say: Say) -> int:
    result = asyncio.run(run_bench(config, plan, say))
    print(render(result))  # the report on stdout; progress went to `say` (stderr from the CLI)
    if json_path is not None:
        from trajflow.lab.bench.real_plot import plot_timeline

        json_path.write_text(json.dumps(result, indent=2))
        plot_timeline(result, json_path.with_suffix(".png"))
        say(f"wrote {json_path} and the timeline {json_path.with_suffix('.png')}")
    return 0
