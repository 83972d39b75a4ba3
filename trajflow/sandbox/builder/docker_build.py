"""The generic steps of a local image build: content hashes, an fcntl build lock, `docker build` from a context
of files and cached wheels, and running a build tool with its output streamed as progress.

Limits: the context is written to a temporary directory under the cache dir and wheels are hard-linked into it,
so the cache must sit on one filesystem; intermediate images a build leaves untagged are not tracked.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import docker  # imported where used: the hashing and wheel helpers run without the SDK (a base install's CLI)

Progress = Callable[[str], None]

UNPRIVILEGED_UID = 65534
"""The unprivileged user (nobody) that the images' processes run as."""


def quiet(_: str) -> None:
    return None


def digest(parts: object) -> str:
    """A short stable hash of a JSON-serialisable description of an image's inputs."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def sha256_file(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


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


def build_lock(cache_dir: Path) -> contextlib.AbstractContextManager[None]:
    """The lock that the base, runtime and task layers are built under (one build at a time per cache dir)."""
    return file_lock(cache_dir / ".build.lock")


def image_exists(client: docker.DockerClient, tag: str) -> bool:
    import docker.errors

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
    executable: frozenset[str] = frozenset(),
    linked: dict[str, Path] | None = None,
) -> None:
    """`docker build` a context of the cached wheels (hard-linked under wheels/; none when `wheels` is None),
    `files` (those named in `executable` with mode 0755, which COPY keeps), the cached files `linked` (by their
    name in the context: hard-linked too) and the Dockerfile."""
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix="context-") as context:
        ctx = Path(context)
        (ctx / "wheels").mkdir()
        for wheel in sorted(wheels.glob("*.whl")) if wheels is not None else ():
            os.link(wheel, ctx / "wheels" / wheel.name)  # same filesystem: no copy
        for name, source in (linked or {}).items():
            (ctx / name).parent.mkdir(parents=True, exist_ok=True)
            os.link(source, ctx / name)
        for name, data in files.items():
            target = ctx / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)  # exactly the bytes that were hashed into the tag
            if name in executable:
                target.chmod(0o755)
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


def publish_dir(staging: Path, target: Path, manifest: object) -> None:
    """Write `manifest` (JSON) into `staging`, then move `staging` to `target` (replacing it): a cache directory is
    complete once its manifest.json exists, since the manifest appears together with the files."""
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def _is_noise(line: str) -> bool:
    """pip's warnings about local index directories that lack a package say nothing useful to a user."""
    return "is ignored: it is neither a file nor a directory" in line


def run_logged(cmd: list[str], progress: Progress, what: str, env: dict[str, str] | None = None) -> None:
    """Run `cmd` (in `env`, default this process's), streaming its output as progress; raise with its tail."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    tail: list[str] = []
    for line in proc.stdout:
        tail = [*tail[-19:], line.rstrip()]
        if not _is_noise(line):
            progress(f"{what}: {line.rstrip()}")
    if proc.wait() != 0:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n" + "\n".join(tail))
