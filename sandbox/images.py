"""Locally built, content-hashed sandbox images in three layers: Debian+Python base, env runtime, task files.

No image registry is reachable, so every image is built here and named by a hash of what defines it:

- `trajflow-base:<hash>`: `debootstrap --variant=minbase --include=python3 bookworm` from the host's Debian
  mirror, imported with `docker import`. The hash covers suite, variant, packages and a format version (not
  the mirror: any mirror gives the same layer).
- `trajflow-runtime:<hash>`: a Dockerfile `FROM` the base that installs wheels downloaded on the host
  (`pip wheel`, so sdists are built here once and the build is offline) and copies in `envs/runner.py`;
  its CMD runs the runner as an unprivileged user. The hash covers the base tag, the requirements, the
  wheels' sha256 and the runner sources (`envs/runner.py`, `envs/shell.py`), so editing the runner rebuilds
  only this layer and the ones above it.
- `trajflow-task:<name>-<hash>`: a shell task's files (`envs/shell_tasks/<name>/`, less its host-only
  reference solution) copied `FROM` the runtime layer. The hash covers the runtime tag and every file, so
  editing a task rebuilds only its own layer. GEM envs need no task layer: they run on the runtime image.

Concurrency: an fcntl lock in `cache_dir` makes many callers (threads or processes) build once.
Listing and pruning old layers: `sandbox/layers.py`.
Limits: Linux x86_64 hosts with CPython 3.11 (the wheels are fetched for the host's interpreter, which must
match the image's Python 3.11); `debootstrap` needs root; old images go only when pruned (`sandbox/layers.py`); intermediate images
that a build leaves untagged are not tracked.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import docker
import docker.errors

from envs.runner import SHELL_PREFIX
from envs.shell import TASKS_ROOT
from sandbox.errors import ImageBuildError

Progress = Callable[[str], None]

BASE_REPO = "trajflow-base"
RUNTIME_REPO = "trajflow-runtime"
BASE_SUITE = "bookworm"
BASE_VARIANT = "minbase"
BASE_PACKAGES: tuple[str, ...] = ("python3",)
BASE_FORMAT = 1
"""Bump when the way the base layer is made changes (cleanup steps, import changes)."""
RUNTIME_FORMAT = 1
"""Bump when the runtime layer changes in a way its Dockerfile text does not show (the text is hashed)."""

RUNTIME_REQUIREMENTS: tuple[str, ...] = (
    "gem-llm==0.1.0",
    # undeclared dependencies of gem-llm 0.1.0
    "datasets==5.2.0",
    "requests==2.34.2",
    "pylatexenc==2.11",
)
PIP_REQUIREMENT = "pip==26.3"
"""Debian minbase python3 has no pip: the image runs pip from this wheel."""

ENVS_DIR = Path(__file__).resolve().parent.parent / "envs"
RUNTIME_SOURCES: tuple[str, ...] = ("runner.py", "shell.py")
"""The files of `envs/` copied into the runtime layer, beside each other in /opt/trajflow."""
SHELL_TASKS_DIR = ENVS_DIR / "shell_tasks"
TASK_REPO = "trajflow-task"
TASK_FORMAT = 1
HOST_ONLY_TASK_FILES = frozenset({"solution.sh"})
"""Files of a task directory that stay out of its image (a reference solution must not be visible to the agent)."""
SANDBOX_UID = 65534
"""The unprivileged user (nobody) that the runner runs as inside the container."""
RUNNER_SOCKET_DIR = "/run/trajflow"
DEFAULT_MIRROR = "http://deb.debian.org/debian"


def _quiet(_: str) -> None:
    return None


def _digest(parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def base_image_tag() -> str:
    """The tag of the base layer; depends only on what defines the layer."""
    parts = {"suite": BASE_SUITE, "variant": BASE_VARIANT, "packages": BASE_PACKAGES, "format": BASE_FORMAT}
    return f"{BASE_REPO}:{_digest(parts)}"


def runtime_sources() -> dict[str, bytes]:
    """The runtime layer's own files (the runner and the shell-task env), by name."""
    return {name: (ENVS_DIR / name).read_bytes() for name in RUNTIME_SOURCES}


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
    return f"{RUNTIME_REPO}:{_digest(parts)}"


def debian_mirror(apt_dir: Path = Path("/etc/apt"), suite: str = BASE_SUITE) -> str:
    """The host's Debian mirror for `suite`: deb822 `*.sources` first, then `sources.list`, then deb.debian.org."""
    for sources in sorted(apt_dir.glob("sources.list.d/*.sources")):
        for stanza in sources.read_text().split("\n\n"):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith(("#", " ")):
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
            if "deb" in fields.get("types", "").split() and suite in fields.get("suites", "").split():
                uris = fields.get("uris", "").split()
                if uris:
                    return uris[0].rstrip("/")
    legacy = apt_dir / "sources.list"
    if legacy.exists():
        for line in legacy.read_text().splitlines():
            words = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()  # drop [options]
            if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
                return words[1].rstrip("/")
    return DEFAULT_MIRROR


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive fcntl lock on `path` (created if missing): callers in any process build one at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_lock(cache_dir: Path) -> contextlib.AbstractContextManager[None]:
    return file_lock(cache_dir / ".build.lock")


def image_exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def build_from_context(
    client: docker.DockerClient,
    cache_dir: Path,
    *,
    tag: str,
    wheels: Path | None,
    files: dict[str, bytes],
    dockerfile: str,
    labels: dict[str, str],
    progress: Progress,
) -> None:
    """`docker build` a context of the cached wheels (hard-linked under wheels/; none when `wheels` is None),
    `files` and the Dockerfile."""
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix="context-") as context:
        ctx = Path(context)
        (ctx / "wheels").mkdir()
        for wheel in sorted(wheels.glob("*.whl")) if wheels is not None else ():
            os.link(wheel, ctx / "wheels" / wheel.name)  # same filesystem: no copy
        for name, data in files.items():
            target = ctx / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)  # exactly the bytes that were hashed into the tag
        (ctx / "Dockerfile").write_text(dockerfile)
        stream = client.api.build(path=str(ctx), tag=tag, rm=True, forcerm=True, decode=True, labels=labels)
        for chunk in stream:
            if "error" in chunk:
                raise RuntimeError(f"docker build of {tag} failed: {chunk['error']}")
            text = str(chunk.get("stream", "")).strip()
            if text:
                progress(f"docker build: {text}")
    if not image_exists(client, tag):
        raise RuntimeError(f"docker build did not produce {tag}")


def _is_noise(line: str) -> bool:
    """pip's warnings about local index directories that lack a package say nothing useful to a user."""
    return "is ignored: it is neither a file nor a directory" in line


def _run_logged(cmd: list[str], progress: Progress, what: str) -> None:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    tail: list[str] = []
    for line in proc.stdout:
        tail = [*tail[-19:], line.rstrip()]
        if not _is_noise(line):
            progress(f"{what}: {line.rstrip()}")
    if proc.wait() != 0:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n" + "\n".join(tail))


def build_base_image(client: docker.DockerClient, cache_dir: Path, tag: str, progress: Progress) -> None:
    """debootstrap a minimal Debian with python3 and `docker import` it as `tag` (needs root)."""
    mirror = debian_mirror()
    started = time.monotonic()
    progress(f"building base image {tag} with debootstrap from {mirror}")
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix="rootfs-") as work:
        rootfs = Path(work) / "rootfs"
        include = ",".join(BASE_PACKAGES)
        cmd = ["debootstrap", f"--variant={BASE_VARIANT}", f"--include={include}", BASE_SUITE, str(rootfs), mirror]
        _run_logged(cmd, progress, "debootstrap")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (rootfs / junk).glob("*"):
                if entry.is_file():
                    entry.unlink()
        progress(f"debootstrap done in {time.monotonic() - started:.1f}s; importing")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        repo, _, version = tag.partition(":")
        changes = ["ENV LANG=C.UTF-8", f"LABEL trajflow.layer=base trajflow.hash={version}", 'CMD ["python3"]']
        client.api.import_image(src=tar.stdout, repository=repo, tag=version, changes=changes, stream_src=True)
        if tar.wait() != 0:
            raise RuntimeError(f"tar of {rootfs} failed (exit {tar.returncode})")
    if not image_exists(client, tag):
        raise RuntimeError(f"docker import did not produce {tag}")
    progress(f"built base image {tag} in {time.monotonic() - started:.1f}s")


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel_dir(cache_dir: Path, requirements: tuple[str, ...] = RUNTIME_REQUIREMENTS) -> Path:
    """Where `download_wheels(cache_dir, ..., requirements)` puts its wheels: one directory per set."""
    key = _digest({"requirements": requirements, "pip": PIP_REQUIREMENT, "python": sys.version_info[:2]})
    return cache_dir / "wheels" / key


def cached_wheels(cache_dir: Path, requirements: tuple[str, ...] = RUNTIME_REQUIREMENTS) -> dict[str, str] | None:
    """The {filename: sha256} of the downloaded wheels, or None if they are not (completely) there."""
    manifest = wheel_dir(cache_dir, requirements) / "manifest.json"
    if not manifest.exists():
        return None
    hashes: dict[str, str] = json.loads(manifest.read_text())
    return hashes


def download_wheels(
    cache_dir: Path, progress: Progress, requirements: tuple[str, ...] = RUNTIME_REQUIREMENTS
) -> dict[str, str]:
    """`pip wheel` the requirements (default: the runtime's) and pip itself into the cache; returns
    {filename: sha256}."""
    target = wheel_dir(cache_dir, requirements)
    started = time.monotonic()
    progress(f"downloading wheels into {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix="staging-"))
    try:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--wheel-dir",
            str(staging),
            *requirements,
            PIP_REQUIREMENT,
        ]
        _run_logged(cmd, progress, "pip wheel")
        hashes = {p.name: _sha256_file(p) for p in sorted(staging.glob("*.whl"))}
        if not any(name.startswith("pip-") for name in hashes):
            raise RuntimeError("pip wheel produced no pip wheel")
        (staging / "manifest.json").write_text(json.dumps(hashes, indent=1, sort_keys=True))
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)  # the manifest appears together with the wheels
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    progress(f"downloaded {len(hashes)} wheels in {time.monotonic() - started:.1f}s")
    return hashes


def wheel_build_stage(base_tag: str, wheel_names: list[str], requirements: tuple[str, ...], target: str) -> str:
    """A Dockerfile build stage that installs the context's wheels/ into `target` with pip run from its wheel
    (the base image has no pip), so that wheels and pip stay out of the final image."""
    pip_wheel = next((name for name in wheel_names if name.startswith("pip-")), "pip-missing.whl")
    reqs = " ".join(f"'{r}'" for r in requirements)
    return f"""\
FROM {base_tag} AS build
COPY wheels/ /w/
RUN python3 /w/{pip_wheel}/pip install --no-index --find-links /w --no-cache-dir --disable-pip-version-check \\
    --root-user-action=ignore --target {target} {reqs}
"""


def runtime_dockerfile(base_tag: str, wheel_names: list[str]) -> str:
    """The runtime layer's Dockerfile; a build stage installs the wheels so they stay out of the image."""
    return wheel_build_stage(base_tag, wheel_names, RUNTIME_REQUIREMENTS, "/opt/trajflow/site") + f"""
FROM {base_tag}
COPY --from=build /opt/trajflow/site /opt/trajflow/site
COPY runner.py shell.py /opt/trajflow/
RUN mkdir -p {RUNNER_SOCKET_DIR} && chown {SANDBOX_UID}:{SANDBOX_UID} {RUNNER_SOCKET_DIR}
ENV PYTHONPATH=/opt/trajflow/site HOME=/tmp MPLCONFIGDIR=/tmp/matplotlib PYTHONUNBUFFERED=1 \\
    PYTHONDONTWRITEBYTECODE=1 TRAJFLOW_ENV_SOCKET={RUNNER_SOCKET_DIR}/env.sock
USER {SANDBOX_UID}:{SANDBOX_UID}
CMD ["python3", "/opt/trajflow/runner.py"]
"""


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


def ensure_base_image(client: docker.DockerClient, cache_dir: Path, progress: Progress | None = None) -> str:
    """The base image tag, building the base layer (under the build lock) if it is missing."""
    base = base_image_tag()
    if image_exists(client, base):
        return base
    with _build_lock(Path(cache_dir)):
        if not image_exists(client, base):  # another caller may have built it while we waited
            build_base_image(client, Path(cache_dir), base, progress or _quiet)
    return base


def cached_runtime_tag(client: docker.DockerClient, cache_dir: Path) -> str | None:
    """The runtime tag when the wheels, the base and the runtime layer are all cached; else None (builds nothing)."""
    hashes = cached_wheels(cache_dir)
    if hashes is None or not image_exists(client, base_image_tag()):
        return None
    tag = runtime_image_tag(base_image_tag(), hashes, runtime_sources())
    return tag if image_exists(client, tag) else None


def ensure_runtime_image(client: docker.DockerClient, cache_dir: Path, progress: Progress | None = None) -> str:
    """The runtime image tag, building the base layer, the wheels and the runtime layer where missing."""
    report = progress or _quiet
    cache_dir = Path(cache_dir)
    tag = cached_runtime_tag(client, cache_dir)
    if tag is not None:
        report(f"runtime image {tag} is cached")
        return tag
    with _build_lock(cache_dir):
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
    return f"{TASK_REPO}:{name}-{_digest(parts)}"


def task_dockerfile(runtime_tag: str, name: str) -> str:
    return f"""\
FROM {runtime_tag}
COPY task/ {TASKS_ROOT}/{name}/
"""


def ensure_task_image(
    client: docker.DockerClient, cache_dir: Path, name: str, progress: Progress | None = None
) -> str:
    """Shell task `name`'s image tag (its layer on the runtime layer), building whatever layer is missing."""
    report = progress or _quiet
    cache_dir = Path(cache_dir)
    files = task_files(name)
    runtime = ensure_runtime_image(client, cache_dir, progress)
    tag = task_image_tag(runtime, name, files)
    if image_exists(client, tag):
        return tag
    with _build_lock(cache_dir):
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

    def __init__(self, client: docker.DockerClient, cache_dir: Path, progress: Progress | None = None) -> None:
        self.client = client
        self.cache_dir = Path(cache_dir)
        self.progress = progress
        self._tags: dict[str, str] = {}
        self._lock = threading.Lock()

    def image_for(self, env_id: str) -> str:
        key = env_id if env_id.startswith(SHELL_PREFIX) else ""
        with self._lock:
            tag = self._tags.get(key)
        if tag is not None:
            return tag
        try:
            tag = image_for_env(self.client, self.cache_dir, env_id, self.progress)
        except UnknownTask:
            raise
        except Exception as e:  # noqa: BLE001 — any failure to build is the same infra fault to the caller
            raise ImageBuildError(f"cannot build the image for {env_id!r}: {type(e).__name__}: {e}") from e
        with self._lock:
            self._tags[key] = tag
        return tag

