"""Offline wheels for image builds: `pip wheel` a set of requirements (and pip itself) into a cache directory
once, per set and host Python, and a Dockerfile build stage that installs them with pip run from its wheel.

A set may name requirements to fetch from the package index alone (`from_index`): pip's configuration (the local
wheel directory it finds through `PIP_FIND_LINKS` or its config files) is ignored for them, so `torch==2.13.0`
takes the index's CUDA build rather than the local `2.13.0+cpu` wheel that the same specifier also matches; their
wheels' sha256 are checked against `expected`.

Limits: the wheels are fetched for the host's interpreter, which must match the image's (CPython 3.11 on Linux
x86_64); a set's wheels are complete once its manifest.json exists.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from trajflow.sandbox.builder.docker_build import Progress, digest, publish_dir, run_logged, sha256_file

PIP_REQUIREMENT = "pip==26.3"
"""Debian minbase python3 has no pip: the image runs pip from this wheel."""


def wheel_dir(cache_dir: Path, requirements: tuple[str, ...]) -> Path:
    """Where `download_wheels(cache_dir, ..., requirements)` puts its wheels: one directory per set."""
    key = digest({"requirements": requirements, "pip": PIP_REQUIREMENT, "python": sys.version_info[:2]})
    return cache_dir / "wheels" / key


def cached_wheels(cache_dir: Path, requirements: tuple[str, ...]) -> dict[str, str] | None:
    """The {filename: sha256} of the downloaded wheels, or None if they are not (completely) there."""
    manifest = wheel_dir(cache_dir, requirements) / "manifest.json"
    if not manifest.exists():
        return None
    hashes: dict[str, str] = json.loads(manifest.read_text())
    return hashes


def _pip_wheel(staging: Path, requirements: list[str], no_deps: bool) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--wheel-dir",
        str(staging),
        *(["--no-deps"] if no_deps else []),
        *requirements,
    ]


def index_only_env() -> dict[str, str]:
    """This process's environment with pip's configuration files and local wheel directories switched off."""
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT")}
    env["PIP_CONFIG_FILE"] = os.devnull  # pip then reads no config file (the user's, the site's or /etc/xdg's)
    return env


def download_wheels(
    cache_dir: Path,
    progress: Progress,
    requirements: tuple[str, ...],
    *,
    no_deps: bool = False,
    from_index: dict[str, str] | None = None,
) -> dict[str, str]:
    """`pip wheel` the requirements and pip itself into the cache; returns {filename: sha256}. `no_deps`: the
    requirements are already the whole pinned closure (pip resolves nothing). `from_index`: {requirement: sha256}
    of those among `requirements` fetched from the package index alone, binaries only, checked against the sha256."""
    target = wheel_dir(cache_dir, requirements)
    started = time.monotonic()
    progress(f"downloading wheels into {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix="staging-"))
    index_reqs = from_index or {}
    try:
        local = [r for r in requirements if r not in index_reqs]
        run_logged(_pip_wheel(staging, [*local, PIP_REQUIREMENT], no_deps), progress, "pip wheel")
        if index_reqs:
            cmd = [*_pip_wheel(staging, list(index_reqs), no_deps), "--only-binary=:all:"]
            run_logged(cmd, progress, "pip wheel (index)", env=index_only_env())
        hashes = {p.name: sha256_file(p) for p in sorted(staging.glob("*.whl"))}
        if not any(name.startswith("pip-") for name in hashes):
            raise RuntimeError("pip wheel produced no pip wheel")
        missing = set(index_reqs.values()) - set(hashes.values())
        if missing:
            raise RuntimeError(f"pip wheel fetched wheels whose sha256 differ from the pins: {sorted(missing)}")
        publish_dir(staging, target, hashes)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    progress(f"downloaded {len(hashes)} wheels in {time.monotonic() - started:.1f}s")
    return hashes


def wheel_build_stage(
    base_tag: str,
    wheel_names: list[str],
    requirements: tuple[str, ...],
    target: str,
    *,
    no_deps: bool = False,
    as_root: bool = False,
) -> str:
    """A Dockerfile build stage that installs the context's wheels/ into `target` with pip run from its wheel
    (the base image has no pip), so that wheels and pip stay out of the final image. `no_deps`: install exactly
    the listed requirements (a pinned closure), resolving nothing. `as_root`: on a base whose user is not root."""
    pip_wheel = next((name for name in wheel_names if name.startswith("pip-")), "pip-missing.whl")
    reqs = " ".join(f"'{r}'" for r in requirements)
    flags = "--no-deps " if no_deps else ""
    user = "USER 0\n" if as_root else ""
    return f"""\
FROM {base_tag} AS build
{user}COPY wheels/ /w/
RUN python3 /w/{pip_wheel}/pip install --no-index --find-links /w --no-cache-dir --disable-pip-version-check \\
    --root-user-action=ignore {flags}--target {target} {reqs}
"""
