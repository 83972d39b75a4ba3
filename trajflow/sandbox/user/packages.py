"""A user env's source (or a dataset task's file) as a package in the object store: a tar of its files, named by
the sha256 of that tar, put once at submission and unpacked once per env worker host (under its cache directory)
where the image layer is built.

The tar is deterministic (sorted names, zero times and owners, mode 0644, or 0755 for a file with an execute bit:
an `agent-cmd:` program must stay runnable), so the same files give the same key on every host and the image layer
built from them is cached by content.
Limits: packages are never deleted from the store (they are small and runs and replays refer to them).
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from trajflow.contracts.store import ObjectStore

KEY_PREFIX = "env-packages"
MARKER = ".trajflow-package"
"""Written last into an unpacked package: its digest (a half-unpacked directory has none)."""


class PackageError(RuntimeError):
    """A package that cannot be fetched or does not match its name."""


def pack(files: dict[str, bytes], executable: frozenset[str] = frozenset()) -> bytes:
    """The deterministic tar of `files` (relative POSIX path -> content); those in `executable` get mode 0755."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(files):
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(files[rel]), 0o755 if rel in executable else 0o644, 0
            tar.addfile(info, io.BytesIO(files[rel]))
    return out.getvalue()


def package_key(data: bytes) -> str:
    return f"{KEY_PREFIX}/{hashlib.sha256(data).hexdigest()}.tar"


def digest_of(uri: str) -> str:
    """The sha256 a package's store URI names."""
    name = uri.rstrip("/").rsplit("/", 1)[-1]
    digest = name.removesuffix(".tar")
    if f"/{KEY_PREFIX}/" not in uri or len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
        raise PackageError(f"{uri!r} is not an env package's URI (…/{KEY_PREFIX}/<sha256>.tar)")
    return digest


def publish(files: dict[str, bytes], store: ObjectStore, executable: frozenset[str] = frozenset()) -> str:
    """Put the package of `files` (a user env's source, a dataset; `executable` those with an execute bit) into the
    store unless it is there; its URI."""
    data = pack(files, executable)
    key = package_key(data)
    uri = store.uri_for(key)
    if not store.exists(uri):
        uri = store.put_bytes(key, data)
    return uri


def extract_files(tar: tarfile.TarFile, dest: Path) -> None:
    """Write the tar's members under `dest`: plain files at relative paths only (what `pack` writes), those with an
    execute bit made executable (0755); an absolute path, a `..`, a link or a device is refused. Checked here rather
    than by tarfile's `filter="data"`, which the Python of the worker image (Debian 12's 3.11.2) does not have."""
    for member in tar.getmembers():
        parts = PurePosixPath(member.name).parts
        if not member.isfile() or member.name.startswith("/") or ".." in parts or not parts:
            raise PackageError(f"env package member {member.name!r} is not a plain file at a relative path")
        out = dest.joinpath(*parts)
        out.parent.mkdir(parents=True, exist_ok=True)
        source = tar.extractfile(member)
        assert source is not None  # a plain file always has its bytes
        out.write_bytes(source.read())
        if member.mode & 0o111:
            out.chmod(0o755)


def unpack(store: ObjectStore, uri: str, cache_dir: Path) -> Path:
    """The directory under `cache_dir` holding the package `uri`, fetched and unpacked on first use; checks
    that the bytes hash to the name."""
    digest = digest_of(uri)
    target = Path(cache_dir) / KEY_PREFIX / digest
    if (target / MARKER).is_file():
        return target
    try:
        data = store.get_bytes(uri)
    except KeyError as e:
        raise PackageError(
            f"env package {uri} is not in the store ({store!r}): was it published to another store?"
        ) from e
    if hashlib.sha256(data).hexdigest() != digest:
        raise PackageError(f"env package {uri}: its content does not hash to its name")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix="staging-"))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            extract_files(tar, staging)
        (staging / MARKER).write_text(digest)
        try:
            os.rename(staging, target)
        except OSError:  # another process unpacked it first
            if not (target / MARKER).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
