"""The image layer of a user's own env (`py:MODULE:CLASS`, `trajflow/sandbox/user/`): its unpacked source and the wheels
of its requirements on the runtime layer, named `trajflow-userenv:<hash>`; a dataset task's (`data:NAME`) is the same
layer holding its one file.

The hash covers the runtime tag, every source file (and which are executable: they stay so in the layer, for
`agent-cmd:` programs), the requirements and their wheels' sha256, so the same package
builds once per host and an edited env gets a new layer. The wheels are downloaded on the host into the wheel cache
(`trajflow.sandbox.builder.wheels`, one directory per requirement set) and installed in a build stage, so the build is
offline. The user's packages go first on the image's PYTHONPATH (/opt/trajflow/userenv, then its requirements, then the
runtime's own site), so the env's pins win over GEM's.
`trajflow images list|prune` (`layers.py`) count these layers current while their runtime is.
Limits: requirements that have no wheel for CPython
3.11 on Linux x86_64 and need a compiler to build fail (the base image has none).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import docker

from trajflow.sandbox.builder import wheels
from trajflow.sandbox.builder.docker_build import Progress, build_from_context, build_lock, digest, image_exists, quiet
from trajflow.sandbox.images import ensure_runtime_image
from trajflow.sandbox.user.source import executable_files, read_requirements, source_files

USER_REPO = "trajflow-userenv"
USER_FORMAT = 1
USER_ROOT = "/opt/trajflow/userenv"
USER_SITE = "/opt/trajflow/user-site"


def user_dockerfile(runtime_tag: str, wheel_names: list[str], requirements: tuple[str, ...]) -> str:
    """The layer's Dockerfile: the requirements installed in a build stage (as root: the runtime's user is not),
    the source copied, the runner and its unprivileged user inherited from the runtime layer."""
    stage = (
        wheels.wheel_build_stage(runtime_tag, wheel_names, requirements, USER_SITE, as_root=True)
        if requirements
        else ""
    )
    copy_site = f"COPY --from=build {USER_SITE} {USER_SITE}\n" if requirements else ""
    return (
        stage
        + f"""
FROM {runtime_tag}
{copy_site}COPY env/ {USER_ROOT}/
ENV PYTHONPATH={USER_ROOT}:{USER_SITE}:/opt/trajflow/site TRAJFLOW_USERENV_DIR={USER_ROOT}
"""
    )


def user_image_tag(
    runtime_tag: str,
    files: dict[str, bytes],
    requirements: tuple[str, ...],
    wheel_hashes: dict[str, str],
    executable: frozenset[str] = frozenset(),
) -> str:
    parts: dict[str, object] = {
        "runtime": runtime_tag,
        "files": {rel: hashlib.sha256(data).hexdigest() for rel, data in sorted(files.items())},
        "requirements": requirements,
        "wheels": wheel_hashes,
        "dockerfile": user_dockerfile(runtime_tag, sorted(wheel_hashes), requirements),
        "format": USER_FORMAT,
    }
    if executable:  # only then: the tags of packages without executables stay what they were
        parts["executable"] = sorted(executable)
    return f"{USER_REPO}:{digest(parts)}"


def ensure_user_image(
    client: docker.DockerClient, cache_dir: Path, package_dir: Path, progress: Progress | None = None
) -> str:
    """The image tag of the user env unpacked in `package_dir`, building the runtime layer, the requirements'
    wheels and this layer where missing."""
    report = progress or quiet
    cache_dir = Path(cache_dir)
    files = source_files(package_dir)
    executable = executable_files(package_dir)
    requirements = read_requirements(package_dir)
    runtime = ensure_runtime_image(client, cache_dir, progress)
    hashes: dict[str, str] = {}
    if requirements:
        hashes = wheels.cached_wheels(cache_dir, requirements) or wheels.download_wheels(
            cache_dir, report, requirements
        )
    tag = user_image_tag(runtime, files, requirements, hashes, executable)
    if image_exists(client, tag):
        return tag
    with build_lock(cache_dir):
        if image_exists(client, tag):  # another caller built it while we waited
            return tag
        started = time.monotonic()
        report(f"building user env image {tag} on {runtime}")
        build_from_context(
            client,
            cache_dir,
            tag=tag,
            wheels=wheels.wheel_dir(cache_dir, requirements) if requirements else None,
            files={f"env/{rel}": data for rel, data in files.items()},
            executable=frozenset(f"env/{rel}" for rel in executable),
            dockerfile=user_dockerfile(runtime, sorted(hashes), requirements),
            labels={"trajflow.layer": "userenv", "trajflow.hash": tag.partition(":")[2], "trajflow.base": runtime},
            progress=report,
        )
        report(f"built user env image {tag} in {time.monotonic() - started:.1f}s")
    return tag
