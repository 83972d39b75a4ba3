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
System packages: the Debian packages named in `debian-packages.txt` are installed with apt-get in the layer (the
build, not the sandbox, needs the Debian mirror of the base image, over HTTP), and the npm packages of
`npm-packages.txt` (`trajflow.sandbox.builder.npm`: fetched on the host, checked, unpacked in a build stage) go to
/opt/trajflow/npm, its bin/ first on PATH, with Debian's `nodejs` added to the Debian packages. Both count in the hash
(the names; the tarballs' integrity), only when present.
Limits: requirements that have no wheel for CPython
3.11 on Linux x86_64 and need a compiler to build fail (the base image has none); the Debian packages are the
mirror's current versions when the layer is built.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import docker

from trajflow.sandbox.builder import npm, wheels
from trajflow.sandbox.builder.docker_build import Progress, build_from_context, build_lock, digest, image_exists, quiet
from trajflow.sandbox.images import SANDBOX_UID, ensure_runtime_image
from trajflow.sandbox.user.source import executable_files, read_requirements, read_system_packages, source_files

USER_REPO = "trajflow-userenv"
USER_FORMAT = 1
USER_ROOT = "/opt/trajflow/userenv"
USER_SITE = "/opt/trajflow/user-site"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""Docker's PATH for an image that sets none (the base layer is imported, so sets none)."""


def user_dockerfile(
    runtime_tag: str,
    wheel_names: list[str],
    requirements: tuple[str, ...],
    debian: tuple[str, ...] = (),
    with_npm: bool = False,
) -> str:
    """The layer's Dockerfile: the requirements installed in a build stage (as root: the runtime's user is not), the
    npm packages in another, the Debian packages with apt-get, the source copied, the runner and its unprivileged user
    inherited from the runtime layer."""
    stage = (
        wheels.wheel_build_stage(runtime_tag, wheel_names, requirements, USER_SITE, as_root=True)
        if requirements
        else ""
    )
    stage += npm.npm_build_stage(runtime_tag) if with_npm else ""
    copy_site = f"COPY --from=build {USER_SITE} {USER_SITE}\n" if requirements else ""
    apt = debian + (("nodejs",) if with_npm and "nodejs" not in debian else ())
    system = ""
    if apt:
        system += (
            f"USER 0\nRUN apt-get update && apt-get install -y --no-install-recommends {' '.join(apt)} "
            f"&& rm -rf /var/lib/apt/lists/*\nUSER {SANDBOX_UID}:{SANDBOX_UID}\n"
        )
    if with_npm:
        system += f"COPY --from=npm {npm.NPM_PREFIX} {npm.NPM_PREFIX}\nENV PATH={npm.NPM_PREFIX}/bin:{SYSTEM_PATH}\n"
    return (
        stage
        + f"""
FROM {runtime_tag}
{system}{copy_site}COPY env/ {USER_ROOT}/
ENV PYTHONPATH={USER_ROOT}:{USER_SITE}:/opt/trajflow/site TRAJFLOW_USERENV_DIR={USER_ROOT}
"""
    )


def user_image_tag(
    runtime_tag: str,
    files: dict[str, bytes],
    requirements: tuple[str, ...],
    wheel_hashes: dict[str, str],
    executable: frozenset[str] = frozenset(),
    debian: tuple[str, ...] = (),
    npm_manifest: dict | None = None,
) -> str:
    parts: dict[str, object] = {
        "runtime": runtime_tag,
        "files": {rel: hashlib.sha256(data).hexdigest() for rel, data in sorted(files.items())},
        "requirements": requirements,
        "wheels": wheel_hashes,
        "dockerfile": user_dockerfile(runtime_tag, sorted(wheel_hashes), requirements, debian, bool(npm_manifest)),
        "format": USER_FORMAT,
    }
    if executable:  # only then: the tags of packages without executables stay what they were
        parts["executable"] = sorted(executable)
    if debian or npm_manifest:  # the same: only then
        parts["system"] = {"debian": debian, "npm": [p["integrity"] for p in (npm_manifest or {}).get("packages", [])]}
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
    debian, npm_specs = read_system_packages(package_dir)
    runtime = ensure_runtime_image(client, cache_dir, progress)
    hashes: dict[str, str] = {}
    if requirements:
        hashes = wheels.cached_wheels(cache_dir, requirements) or wheels.download_wheels(
            cache_dir, report, requirements
        )
    manifest = None
    if npm_specs:
        manifest = npm.cached_tarballs(cache_dir, npm_specs) or npm.download_tarballs(cache_dir, npm_specs, report)
    tag = user_image_tag(runtime, files, requirements, hashes, executable, debian, manifest)
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
            files={f"env/{rel}": data for rel, data in files.items()}
            | ({"npm/install.py": npm.INSTALL.encode()} if manifest else {}),
            executable=frozenset(f"env/{rel}" for rel in executable),
            linked=_npm_files(cache_dir, npm_specs, manifest),
            dockerfile=user_dockerfile(runtime, sorted(hashes), requirements, debian, manifest is not None),
            labels={"trajflow.layer": "userenv", "trajflow.hash": tag.partition(":")[2], "trajflow.base": runtime},
            progress=report,
        )
        report(f"built user env image {tag} in {time.monotonic() - started:.1f}s")
    return tag


def _npm_files(cache_dir: Path, specs: tuple[str, ...], manifest: dict | None) -> dict[str, Path]:
    """The npm tarballs and their manifest, by name in the build context (npm/)."""
    if manifest is None:
        return {}
    folder = npm.tarball_dir(cache_dir, specs)
    names = [p["file"] for p in manifest["packages"]] + ["manifest.json"]
    return {f"npm/{name}": folder / name for name in names}
