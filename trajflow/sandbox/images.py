"""Locally built, content-hashed sandbox images in three layers: Debian+Python base, env runtime, task files.

No image registry is reachable, so every image is built here and named by a hash of what defines it:

- `trajflow-base:<hash>`: the Debian base layer of `trajflow.sandbox.builder.base` (debootstrap minbase + python3).
- `trajflow-runtime:<hash>`: a Dockerfile `FROM` the base that installs wheels downloaded on the host
  (`trajflow.sandbox.builder.wheels`, so sdists are built here once and the build is offline), copies in
  `trajflow/envs/runner.py` and the env modules it hosts beside it (`RUNTIME_SOURCES`; the env id prefixes of
  `trajflow/contracts/env_ids.py` too, `CONTRACT_SOURCES`), and NLTK's `words` corpus to
  `/usr/share/nltk_data` (vendored in `trajflow/envs/nltk_data/`, see its SOURCE.md: GEM's word games read it and
  sandboxes cannot download it); its CMD runs the runner as an unprivileged user. The hash covers the base tag, the
  requirements, the wheels' sha256 and every file copied in (`runtime_sources`), so editing the runner rebuilds only
  this layer and the ones above it.
- `trajflow-task:<name>-<hash>`: a shell task's files (`trajflow/envs/shell_tasks/<name>/`, less its host-only
  reference solution) copied `FROM` the runtime layer. The hash covers the runtime tag and every file, so
  editing a task rebuilds only its own layer. GEM envs need no task layer: they run on the runtime image.

The generic build steps (context builds, the base layer, wheels, hashing, the lock) live in `trajflow/sandbox/builder/`.
Concurrency: an fcntl lock in `cache_dir` makes many callers (threads or processes) build once.
Listing and pruning old layers: `trajflow/sandbox/layers.py`.
Limits: Linux x86_64 hosts with CPython 3.11 (the wheels are fetched for the host's interpreter, which must
match the image's Python 3.11); `debootstrap` needs root; old images go only when pruned (`trajflow/sandbox/layers.py`);
intermediate images that a build leaves untagged are not tracked.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import docker

from trajflow.contracts.env_ids import AGENT_PREFIXES, DATA_PREFIX, SHELL_PREFIX, USER_PREFIX
from trajflow.envs.shell import TASKS_ROOT
from trajflow.sandbox.builder import wheels
from trajflow.sandbox.builder.base import base_image_tag, build_base_image
from trajflow.sandbox.builder.docker_build import (
    UNPRIVILEGED_UID,
    Progress,
    build_from_context,
    build_lock,
    digest,
    image_exists,
    quiet,
)
from trajflow.sandbox.builder.wheels import PIP_REQUIREMENT, wheel_build_stage
from trajflow.sandbox.errors import ImageBuildError

RUNTIME_REPO = "trajflow-runtime"
RUNTIME_FORMAT = 1
"""Bump when the runtime layer changes in a way its Dockerfile text does not show (the text is hashed)."""

RUNTIME_REQUIREMENTS: tuple[str, ...] = (
    "gem-llm==0.1.0",
    # undeclared dependencies of gem-llm 0.1.0
    "datasets==5.2.0",
    "requests==2.34.2",
    "pylatexenc==2.11",
    # `gym:` envs (trajflow/envs/gym_adapter.py); its other dependencies (numpy, cloudpickle, typing-extensions) come
    # with gem
    "gymnasium==1.4.0",
)

ENVS_DIR = Path(str(resources.files("trajflow.envs")))
"""The envs package where Python imports it from: its runner sources, NLTK data and shell tasks are package data."""
CONTRACTS_DIR = Path(str(resources.files("trajflow.contracts")))

RUNTIME_SOURCES: tuple[str, ...] = (
    "runner.py",
    "gem_loader.py",
    "shell.py",
    "gym_adapter.py",
    "gym_text.py",
    "dataset.py",
    "verify.py",
    "agent.py",
    "agent_cmd.py",
    "agent_http.py",
    "agent_chat.py",
    "agent_messages.py",
    "agent_process.py",
    "agent_responses.py",
    "agent_verify.py",
)
"""The files of `trajflow/envs/` copied into the runtime layer, beside each other in /opt/trajflow (the runner imports
its siblings flat there)."""
CONTRACT_SOURCES: tuple[str, ...] = ("env_ids.py",)
"""The stdlib-only files of `trajflow/contracts/` the runner imports, copied beside it too: the env id prefixes are
defined once, for the host and the sandbox."""

NLTK_DATA_DIR = ENVS_DIR / "nltk_data"
NLTK_WORDS: tuple[str, ...] = ("corpora/words/README", "corpora/words/en", "corpora/words/en-basic")
"""NLTK's `words` corpus, relative to NLTK_DATA_DIR (vendored, unchanged: trajflow/envs/nltk_data/SOURCE.md)."""
IMAGE_NLTK_DATA = "/usr/share/nltk_data"
"""Where the image holds NLTK's data: the first of NLTK's default data paths on Linux, and NLTK_DATA."""

SHELL_TASKS_DIR = ENVS_DIR / "shell_tasks"

TASK_REPO = "trajflow-task"

TASK_FORMAT = 1

HOST_ONLY_TASK_FILES = frozenset({"solution.sh"})
"""Files of a task directory that stay out of its image (a reference solution must not be visible to the agent)."""
SANDBOX_UID = UNPRIVILEGED_UID
"""The unprivileged user (nobody) that the runner runs as inside the container."""
RUNNER_SOCKET_DIR = "/run/trajflow"


def runtime_sources() -> dict[str, bytes]:
    """The runtime layer's own files, by path in its build context: the runner and the env modules beside it
    (`RUNTIME_SOURCES`, `CONTRACT_SOURCES`), and NLTK's words corpus under `nltk_data/`. All of them are hashed into
    its tag."""
    files = {name: (ENVS_DIR / name).read_bytes() for name in RUNTIME_SOURCES}
    files |= {name: (CONTRACTS_DIR / name).read_bytes() for name in CONTRACT_SOURCES}
    files |= {f"nltk_data/{rel}": (NLTK_DATA_DIR / rel).read_bytes() for rel in NLTK_WORDS}
    return files


def runtime_image_tag(base_tag: str, wheel_hashes: dict[str, str], sources: dict[str, bytes]) -> str:
    """The tag of the runtime layer built on `base_tag` from these wheels and these source files."""
    parts = {
        "base": base_tag,
        "requirements": RUNTIME_REQUIREMENTS,
        "pip": PIP_REQUIREMENT,
        "wheels": wheel_hashes,
        "sources": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(sources.items())},
        "dockerfile": runtime_dockerfile(base_tag, sorted(wheel_hashes)),
        "format": RUNTIME_FORMAT,
    }
    return f"{RUNTIME_REPO}:{digest(parts)}"


def wheel_dir(cache_dir: Path) -> Path:
    """Where the runtime layer's wheels are cached."""
    return wheels.wheel_dir(cache_dir, RUNTIME_REQUIREMENTS)


def cached_wheels(cache_dir: Path) -> dict[str, str] | None:
    """The {filename: sha256} of the runtime layer's downloaded wheels, or None if they are not all there."""
    return wheels.cached_wheels(cache_dir, RUNTIME_REQUIREMENTS)


def download_wheels(cache_dir: Path, progress: Progress) -> dict[str, str]:
    """`pip wheel` the runtime layer's requirements (and pip) into the cache; returns {filename: sha256}."""
    return wheels.download_wheels(cache_dir, progress, RUNTIME_REQUIREMENTS)


def runtime_dockerfile(base_tag: str, wheel_names: list[str]) -> str:
    """The runtime layer's Dockerfile; a build stage installs the wheels so they stay out of the image."""
    return (
        wheel_build_stage(base_tag, wheel_names, RUNTIME_REQUIREMENTS, "/opt/trajflow/site")
        + f"""
FROM {base_tag}
COPY --from=build /opt/trajflow/site /opt/trajflow/site
COPY {" ".join((*RUNTIME_SOURCES, *CONTRACT_SOURCES))} /opt/trajflow/
COPY nltk_data/ {IMAGE_NLTK_DATA}/
RUN mkdir -p {RUNNER_SOCKET_DIR} && chown {SANDBOX_UID}:{SANDBOX_UID} {RUNNER_SOCKET_DIR}
ENV PYTHONPATH=/opt/trajflow/site HOME=/tmp MPLCONFIGDIR=/tmp/matplotlib PYTHONUNBUFFERED=1 \\
    PYTHONDONTWRITEBYTECODE=1 TRAJFLOW_ENV_SOCKET={RUNNER_SOCKET_DIR}/env.sock NLTK_DATA={IMAGE_NLTK_DATA}
USER {SANDBOX_UID}:{SANDBOX_UID}
CMD ["python3", "/opt/trajflow/runner.py"]
"""
    )


def build_runtime_image(
    client: docker.DockerClient, cache_dir: Path, base_tag: str, tag: str, progress: Progress
) -> None:
    """Build the runtime layer `tag` from the cached wheels and the current runner source."""
    started = time.monotonic()
    progress(f"building runtime image {tag} on {base_tag}")
    wheels = wheel_dir(cache_dir)
    build_from_context(
        client,
        cache_dir,
        tag=tag,
        wheels=wheels,
        files=runtime_sources(),
        dockerfile=runtime_dockerfile(base_tag, sorted(p.name for p in wheels.glob("*.whl"))),
        labels={"trajflow.layer": "runtime", "trajflow.hash": tag.partition(":")[2], "trajflow.base": base_tag},
        progress=progress,
    )
    progress(f"built runtime image {tag} in {time.monotonic() - started:.1f}s")


def cached_runtime_tag(client: docker.DockerClient, cache_dir: Path) -> str | None:
    """The runtime tag when the wheels, the base and the runtime layer are all cached; else None (builds nothing)."""
    hashes = cached_wheels(cache_dir)
    if hashes is None or not image_exists(client, base_image_tag()):
        return None
    tag = runtime_image_tag(base_image_tag(), hashes, runtime_sources())
    return tag if image_exists(client, tag) else None


def ensure_runtime_image(client: docker.DockerClient, cache_dir: Path, progress: Progress | None = None) -> str:
    """The runtime image tag, building the base layer, the wheels and the runtime layer where missing."""
    report = progress or quiet
    cache_dir = Path(cache_dir)
    tag = cached_runtime_tag(client, cache_dir)
    if tag is not None:
        report(f"runtime image {tag} is cached")
        return tag
    with build_lock(cache_dir):
        tag = cached_runtime_tag(client, cache_dir)  # another caller may have built it while we waited
        if tag is not None:
            report(f"runtime image {tag} was built by another caller")
            return tag
        base = base_image_tag()
        if not image_exists(client, base):
            build_base_image(client, cache_dir, base, report)
        hashes = cached_wheels(cache_dir) or download_wheels(cache_dir, report)
        tag = runtime_image_tag(base, hashes, runtime_sources())
        if not image_exists(client, tag):
            build_runtime_image(client, cache_dir, base, tag, report)
        return tag


class UnknownTask(ValueError):
    """No shell task of that name ships with trajflow."""


def shell_task_names(tasks_dir: Path = SHELL_TASKS_DIR) -> list[str]:
    """The shell tasks that ship with trajflow (directories with a task.json)."""
    return sorted(p.parent.name for p in tasks_dir.glob("*/task.json"))


def task_files(name: str, tasks_dir: Path = SHELL_TASKS_DIR) -> dict[str, bytes]:
    """The files of shell task `name` that go into its layer, by path relative to the task's directory."""
    root = tasks_dir / name
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", name) or not (root / "task.json").is_file():
        raise UnknownTask(f"no shell task {name!r}; the shipped ones are {', '.join(shell_task_names(tasks_dir))}")
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name not in HOST_ONLY_TASK_FILES and "__pycache__" not in path.parts
    }


def task_image_tag(runtime_tag: str, name: str, files: dict[str, bytes]) -> str:
    """The tag of task `name`'s layer on `runtime_tag`; it changes with the runtime layer or any task file."""
    parts = {
        "runtime": runtime_tag,
        "task": name,
        "files": {rel: hashlib.sha256(data).hexdigest() for rel, data in sorted(files.items())},
        "dockerfile": task_dockerfile(runtime_tag, name),
        "format": TASK_FORMAT,
    }
    return f"{TASK_REPO}:{name}-{digest(parts)}"


def task_dockerfile(runtime_tag: str, name: str) -> str:
    return f"""\
FROM {runtime_tag}
COPY task/ {TASKS_ROOT}/{name}/
"""


def ensure_task_image(client: docker.DockerClient, cache_dir: Path, name: str, progress: Progress | None = None) -> str:
    """Shell task `name`'s image tag (its layer on the runtime layer), building whatever layer is missing."""
    report = progress or quiet
    cache_dir = Path(cache_dir)
    files = task_files(name)
    runtime = ensure_runtime_image(client, cache_dir, progress)
    tag = task_image_tag(runtime, name, files)
    if image_exists(client, tag):
        return tag
    with build_lock(cache_dir):
        if image_exists(client, tag):  # another caller built it while we waited
            report(f"task image {tag} was built by another caller")
            return tag
        started = time.monotonic()
        report(f"building task image {tag} on {runtime}")
        build_task_image(client, cache_dir, runtime, name, tag, report)
        report(f"built task image {tag} in {time.monotonic() - started:.1f}s")
    return tag


def build_task_image(
    client: docker.DockerClient,
    cache_dir: Path,
    runtime: str,
    name: str,
    tag: str,
    progress: Progress,
    labels: dict[str, str] | None = None,
) -> None:
    """Build shell task `name`'s layer on `runtime` as `tag` (no lock, no cache check: `ensure_task_image` does
    those)."""
    build_from_context(
        client,
        cache_dir,
        tag=tag,
        wheels=None,
        files={f"task/{rel}": data for rel, data in task_files(name).items()},
        dockerfile=task_dockerfile(runtime, name),
        labels={"trajflow.layer": "task", "trajflow.hash": tag.partition(":")[2], "trajflow.base": runtime}
        | (labels or {}),
        progress=progress,
    )


def image_for_env(client: docker.DockerClient, cache_dir: Path, env_id: str, progress: Progress | None = None) -> str:
    """The image that hosts `env_id`: a shell task's own layer for `shell:<task>`, else the runtime layer."""
    if env_id.startswith(SHELL_PREFIX):
        return ensure_task_image(client, cache_dir, env_id.removeprefix(SHELL_PREFIX), progress)
    return ensure_runtime_image(client, cache_dir, progress)


class ImageResolver:
    """Env id -> image tag for one env worker: builds what a task needs on first use, once however many
    trajectories ask at the same moment (the build lock), and remembers the answer (a restarted worker
    re-hashes, so edited task files take effect on restart). Build failures raise `ImageBuildError`."""

    def __init__(
        self,
        client: docker.DockerClient,
        cache_dir: Path,
        progress: Progress | None = None,
        unpack: Callable[[str], Path] | None = None,
    ) -> None:
        self.client = client
        self.cache_dir = Path(cache_dir)
        self.progress = progress
        self.unpack = unpack
        """A user env's package URI -> the directory it is unpacked in (`trajflow.sandbox.user.packages.unpack` on the
        worker's store); None: this worker hosts no `py:` envs."""
        self._tags: dict[str, str] = {}
        self._lock = threading.Lock()

    def image_for(self, env_id: str, package: str = "") -> str:
        """The image of `env_id`; `package`: a `py:`, `agent:`, `agent-cmd:` or `data:` env's package URI
        (`TrajectoryRequest.env_package`), whose layer holds the user's source."""
        user = env_id.startswith((USER_PREFIX, DATA_PREFIX, *AGENT_PREFIXES))
        if user and not package and env_id.startswith(AGENT_PREFIXES):
            raise UnknownTask(
                f'{env_id}: an agent: program needs its source directory packed: give the task env_path = "DIR" '
                "(or --env-path DIR), the directory that holds its module or command; the submission then sets "
                "env_package"
            )
        if user and not package:
            raise UnknownTask(
                f"{env_id}: a py: or data: env needs its package (env_package), set when its run is submitted"
            )
        key = package if user else env_id if env_id.startswith(SHELL_PREFIX) else ""
        with self._lock:
            tag = self._tags.get(key)
        if tag is not None:
            return tag
        try:
            if user:
                from trajflow.sandbox.user_images import ensure_user_image

                if self.unpack is None:
                    raise RuntimeError("this env worker was started without a store for user env packages")
                tag = ensure_user_image(self.client, self.cache_dir, self.unpack(package), self.progress)
            else:
                tag = image_for_env(self.client, self.cache_dir, env_id, self.progress)
        except UnknownTask:
            raise
        except Exception as e:
            raise ImageBuildError(f"cannot build the image for {env_id!r}: {type(e).__name__}: {e}") from e
        with self._lock:
            self._tags[key] = tag
        return tag
