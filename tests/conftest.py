"""Shared fixtures: the real Temporal dev server, the real reward service, Docker sandboxes, a tiny real model.

Integration fixtures are session-scoped (started once) but every test gets its own task queues, by using
fresh pool names and a fresh orchestrator queue. Subprocesses are ended by PID. No fixed sleeps.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from temporalio.client import Client

    from trajflow.infra.store import ObjectStore
    from trajflow.rl.engines.base import Engine

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("TRAJFLOW_TEST_CACHE", Path.home() / ".cache" / "trajflow-tests"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` skip, saying why, where torch sees no CUDA device: a CPU build of torch (the lock's), or a
    CUDA build with no device visible (torch is imported only when one was collected)."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch

    if not torch.cuda.is_available():
        build = f"torch {torch.__version__} " + (
            f"(CUDA {torch.version.cuda}) sees no device" if torch.version.cuda else "is a CPU build"
        )
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason=f"needs a CUDA device; {build}"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Each test's report is made with the garbage collector paused. Formatting a failure parses the test's source
    (`ast.parse`), and on CPython 3.11 a parse that runs while another is under way, as when a collection during it
    runs a finalizer that logs a traceback (OpenTelemetry's, for a workflow's coroutine collected unfinished), fails
    the outer one: pytest then stops the whole session with an INTERNALERROR ("AST constructor recursion depth
    mismatch") instead of reporting one failed test. With no collection, no Python code runs inside the parse."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return (yield)
    finally:
        if was_enabled:
            gc.enable()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: real pretrained model; minutes")
    # A workflow whose __init__ raises (bad input, workflows/inputs.py) never runs the coroutine the SDK made for its
    # run method; the SDK's leftover is reported whenever it is garbage-collected, often in a later test.
    config.addinivalue_line(
        "filterwarnings", "ignore:coroutine '_WorkflowInstanceImpl._apply_initialize_workflow:RuntimeWarning"
    )


class ManualClock:
    """A clock a test moves by hand (`clock.now += 5`), for code that takes a monotonic `clock`."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def free_port() -> int:
    """A port for a server a test starts later (below the ephemeral range: `trajflow.infra.ports.free_port`)."""
    from trajflow.infra.ports import free_port as pick

    return pick()


def wait_for(predicate, timeout_s: float = 30.0, interval_s: float = 0.1, what: str = "condition"):
    """Poll until predicate() is truthy (returning it) or fail after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


async def async_wait_for(predicate, timeout_s: float = 30.0, interval_s: float = 0.1, what: str = "condition"):
    import asyncio

    deadline = time.monotonic() + timeout_s
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(interval_s)


async def pending_work(client, run_id: str) -> str:
    """What a run is waiting on, for the message of a test that timed out: the training workflow's and its running
    trajectories' pending workflow task and activities (attempt, heartbeat, last failure), the last workflow-task
    failures in their histories, and the stacks of this process's threads and asyncio tasks (the in-process
    workers: where an activity is blocked)."""
    import asyncio
    import io
    import sys
    import traceback

    from trajflow.contracts import names

    lines = []
    query = f"(WorkflowId = '{run_id}' OR TrajflowRun = '{run_id}') AND ExecutionStatus = 'Running'"
    async for wf in client.list_workflows(query):
        handle = client.get_workflow_handle(wf.id)
        desc = (await handle.describe()).raw_description
        pending = desc.pending_activities
        lines.append(f"{wf.id} ({wf.workflow_type}): {len(pending)} pending activities")
        if wf.workflow_type == "TrainingWorkflow":
            state = await handle.query(names.QUERY_STATE)
            groups = {k: (len(g["running"]), len(g["completed"]), g["failed"]) for k, g in state["groups"].items()}
            lines.append(f"  version={state['version']} paused={state['paused']!r} counters={state['counters']}")
            lines.append(f"  groups (running, completed, failed): {groups}")
        if desc.HasField("pending_workflow_task"):
            t = desc.pending_workflow_task
            lines.append(f"  workflow task state={t.state} attempt={t.attempt}")
        for a in pending:
            failure = a.last_failure.message if a.HasField("last_failure") else ""
            beat = a.last_heartbeat_time.ToDatetime().isoformat() if a.HasField("last_heartbeat_time") else "never"
            lines.append(
                f"  {a.activity_type.name} state={a.state} attempt={a.attempt} heartbeat={beat} "
                f"last_worker={a.last_worker_identity!r} failure={failure!r}"
            )
        failed = []
        async for event in handle.fetch_history_events():
            if event.HasField("workflow_task_failed_event_attributes"):
                failed.append(event.workflow_task_failed_event_attributes.failure.message)
        for msg in failed[-3:]:
            lines.append(f"  workflow task failed: {msg[:500]!r}")
    out = io.StringIO()
    frames = sys._current_frames()
    for thread_id, frame in frames.items():
        if frame.f_code.co_name in ("wait", "get") and "work_queue.get" in "".join(traceback.format_stack(frame)):
            continue  # an idle pool thread
        out.write(f"--- thread {thread_id}\n{''.join(traceback.format_stack(frame)[-6:])}")
    for task in asyncio.all_tasks():
        stack = task.get_stack(limit=3)
        if stack:
            where = " <- ".join(
                f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno} {f.f_code.co_name}" for f in stack
            )
            out.write(f"--- task {task.get_name()}: {where}\n")
    return "\n".join(lines or [f"no running workflow of run {run_id}"]) + "\n" + out.getvalue()


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    return CACHE


@pytest.fixture(scope="session")
def tiny_model(cache_dir: Path) -> Path:
    from trajflow.rl.models import build_tiny_model

    return build_tiny_model(cache_dir / "models" / "tiny")


@pytest.fixture(scope="session")
async def temporal_env():
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.testing import WorkflowEnvironment

    from trajflow.infra.temporal import dev_server_args, temporal_binary

    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=temporal_binary(),
        dev_server_extra_args=dev_server_args(),
    )
    try:
        yield env
    finally:
        await env.shutdown()


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float, what: str, log: Path | None = None) -> None:
    """Wait until the HTTP server `proc` answers 200 on `url`/healthz; fail at once (with the end of `log`) if it
    exits first."""

    def healthy() -> bool:
        assert proc.poll() is None, f"{what} exited" + (f": {log.read_text()[-2000:]}" if log else "")
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(healthy, timeout_s, what=f"{what} health")


@pytest.fixture(scope="session")
def reward_service() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trajflow.rewards.service", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, 30, "reward service")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def docker_client():
    import docker

    client = docker.from_env()
    client.ping()
    return client


@pytest.fixture(scope="session")
def runtime_image(docker_client, cache_dir: Path) -> str:
    from trajflow.sandbox.images import ensure_runtime_image

    return ensure_runtime_image(docker_client, cache_dir / "images")


@pytest.fixture(scope="session")
def sandbox_manager(docker_client, runtime_image: str, tmp_path_factory):
    from trajflow.sandbox.manager import SandboxManager

    manager = SandboxManager(
        docker_client,
        runtime_image,
        tmp_path_factory.mktemp("sandboxes"),
        f"test-{os.getpid()}",
        step_timeout_s=30,
    )
    yield manager
    manager.close_all()


@pytest.fixture()
def store(tmp_path: Path):
    from trajflow.infra.store import LocalStore

    return LocalStore(tmp_path / "store")


@pytest.fixture()
def package_images(docker_client, cache_dir, store):
    """An image resolver as an env worker makes one: `py:` and `data:` envs from their packages in `store`."""
    from trajflow.sandbox.images import ImageResolver
    from trajflow.sandbox.user.packages import unpack

    images = cache_dir / "images"
    return ImageResolver(docker_client, images, unpack=lambda uri: unpack(store, uri, images))


@dataclass
class Stack:
    """In-process workers of every pool kind on fresh queues, against the session's real services."""

    client: Client
    queue: str
    pools: str
    store: ObjectStore
    manager: object
    tag: str = ""
    workers: list = field(default_factory=list)
    """The in-process workers, for tests that stop some of them (a host that dies)."""

    def request(self, **fields):
        from trajflow.contracts.trajectory import StagePools, TrajectoryRequest

        fields.setdefault("pools", StagePools(decode=self.pools, env=self.pools, reward=self.pools))
        return TrajectoryRequest(**fields)

    async def run(self, req, workflow_id: str | None = None):
        from trajflow.client import run_trajectory

        return await run_trajectory(req, client=self.client, task_queue=self.queue, workflow_id=workflow_id)

    async def start(self, req, workflow_id: str | None = None):
        from trajflow.client import start_trajectory

        return await start_trajectory(req, client=self.client, task_queue=self.queue, workflow_id=workflow_id)


@asynccontextmanager
async def running_stack(
    temporal_env,
    reward_url: str,
    store,
    manager,
    engine,
    decode_pools: dict[str, Engine] | None = None,
    trainer_model: Path | None = None,
    tag: str | None = None,
    images=None,
    train_step_s: float = 0.3,
    external_trainer: bool = False,
) -> AsyncIterator[Stack]:
    """Start orchestrator, decode, env, reward and trainer workers in this process on a fresh set of queues
    (or on the queues of `tag`, to restart a stack's workers). With `images` (an `ImageResolver`) the env
    worker resets each env on its own image, as a real one does (shell tasks on their task layer). The trainer
    is the real one on `trainer_model`; without one, the benchmarks' simulated trainer (registered under the
    real activity name), whose every step sleeps `train_step_s`; with `external_trainer`, none: the test serves the
    trainer pool `stack.pools` itself (a launched trainer process)."""
    import asyncio
    import tempfile

    from trajflow.lab.bench.sim_trainer import simulated_trainer_workers
    from trajflow.rewards.client import RewardClient
    from trajflow.workers.decode import decode_workers
    from trajflow.workers.env import env_workers
    from trajflow.workers.orchestrator import orchestrator_workers
    from trajflow.workers.reward import reward_workers
    from trajflow.workers.trainer import trainer_workers

    client = temporal_env.client
    tag = tag or uuid.uuid4().hex[:8]
    pools = f"t{tag}"
    queue = f"trajflow-test-{tag}"
    reward_client = RewardClient(reward_url, timeout_s=10)
    worker_id = f"w{tag}"
    workers = orchestrator_workers(client, queue)
    workers += env_workers(client, manager, [pools], worker_id, step_timeout_s=30, images=images)
    workers += reward_workers(client, reward_client, store, [pools])
    for pool, pool_engine in (decode_pools or {pools: engine}).items():
        workers += decode_workers(client, pool_engine, store, [pool], f"{worker_id}-{pool}")
    work = Path(tempfile.mkdtemp(prefix=f"trainer-{tag}-"))
    if external_trainer:
        pass
    elif trainer_model is not None:
        workers += trainer_workers(client, store, trainer_model, work, [pools], work / "cache")
    else:
        workers += simulated_trainer_workers(client, store, [pools], work / "cache", default_step_s=train_step_s)[0]
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        yield Stack(client=client, queue=queue, pools=pools, store=store, manager=manager, tag=tag, workers=workers)
    finally:
        await asyncio.gather(*(w.shutdown() for w in workers), return_exceptions=True)
        for t in tasks:
            t.cancel()
        await reward_client.close()


def submitted_offline(config: Path, state_dir: Path, commands: tuple[str, ...] = ("train", "rollout")) -> list:
    """`trajflow train CONFIG` and `trajflow rollout -c CONFIG` against no Temporal (127.0.0.1:9): what submission
    says of a config before anything can run (a bad env or program exits 2 there). One finished process a command."""
    env = {**os.environ, "TRAJFLOW_STATE_DIR": str(state_dir), "TRAJFLOW_TEMPORAL_ADDRESS": "127.0.0.1:9"}
    trajflow = str(Path(sys.executable).parent / "trajflow")
    argv = {"train": ["train", str(config)], "rollout": ["rollout", "-c", str(config)]}
    return [
        subprocess.run([trajflow, *argv[c]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        for c in commands
    ]


@dataclass
class CliStack:
    """The embedded stack as a user starts it (`trajflow up`), in its own state dir and ports."""

    env: dict[str, str]
    state_dir: Path
    ui_url: str
    config: Path

    async def connect(self) -> Client:
        """A client made as the stack's own processes make one: `trajflow.infra.temporal.connect` with the stack's
        settings."""
        from trajflow.infra.settings import Settings
        from trajflow.infra.temporal import connect

        return await connect(Settings(state_dir=self.state_dir, temporal_address=self.env["TRAJFLOW_TEMPORAL_ADDRESS"]))

    def trajflow(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "trajflow"), *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"trajflow {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc


WHEEL_SOURCES = ("pyproject.toml", "README.md", "trajflow")
"""What setuptools packs into the wheel (pyproject.toml's packages), copied so the build leaves nothing in ROOT; the
copy follows trajflow/'s links to the design card's folders."""


def outside_env() -> dict[str, str]:
    """This environment without PYTHONPATH (nor VIRTUAL_ENV): the checkout, where pip would also find trajflow's
    metadata, stays out of what a fresh venv runs."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


@pytest.fixture(scope="session")
def trajflow_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, built once a session from a copy of what it packs (a build in place would leave
    build/ and *.egg-info in ROOT); the project's venv has setuptools, so no isolated build env is downloaded."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    for name in WHEEL_SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(work), str(src)]
    done = subprocess.run(build, capture_output=True, text=True, timeout=600, env=outside_env())
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = work.glob("trajflow-*.whl")
    return wheel


def stack_state_dir(cache_dir: Path, prefix: str) -> Path:
    """A fresh state dir for a stack a test starts, sharing the session's model and image caches (nothing is
    converted or built twice). Short, under /tmp: sandbox sockets live under it and Unix socket paths are limited
    to 107 bytes."""
    import tempfile

    state_dir = Path(tempfile.mkdtemp(prefix=prefix))
    (state_dir / "cache").mkdir()
    for name in ("models", "images"):
        (cache_dir / name).mkdir(parents=True, exist_ok=True)
        (state_dir / "cache" / name).symlink_to(cache_dir / name)
    return state_dir


@contextmanager
def started_cli_stack(cache_dir: Path, config: Path, prefix: str = "tf-state-") -> Iterator[CliStack]:
    """`trajflow up -c CONFIG` in a fresh state dir on free ports (the caches shared), `trajflow down` after."""
    state_dir = stack_state_dir(cache_dir, prefix)
    ui_port = free_port()
    env = {
        **os.environ,
        "TRAJFLOW_STATE_DIR": str(state_dir),
        "TRAJFLOW_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",
        "TRAJFLOW_TEMPORAL_UI_PORT": str(ui_port),
        "TRAJFLOW_REWARD_PORT": str(free_port()),
        "TRAJFLOW_PROMETHEUS_PORT": str(free_port()),
        # spans to the state dir's files (test_traces reads them), whatever the shell says
        "TRAJFLOW_OTLP_ENDPOINT": "",
        # this checkout's code for the `trajflow` command too (the workers, `python -m trajflow` here, have it
        # already), not an editable install of another checkout
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    stack = CliStack(env=env, state_dir=state_dir, ui_url=f"http://127.0.0.1:{ui_port}", config=config)
    try:
        stack.trajflow("up", "-c", str(stack.config))
        yield stack
    finally:
        stack.trajflow("down", check=False)
        import shutil

        shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def cli_stack(cache_dir: Path) -> Iterator[CliStack]:
    with started_cli_stack(cache_dir, ROOT / "trajflow" / "configs" / "tiny.toml") as stack:
        yield stack
