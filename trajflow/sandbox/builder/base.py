"""The Debian base layer every locally built image starts from: `trajflow-base:<hash>`.

`debootstrap --variant=minbase --include=python3 bookworm` from the host's Debian mirror, imported with `docker
import`. The hash covers suite, variant, packages and a format version (not the mirror: any mirror gives the same
layer).

Limits: `debootstrap` needs root; the image has python3 but no pip (images install wheels with pip run from its
own wheel, `trajflow.sandbox.builder.wheels.wheel_build_stage`).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from pathlib import Path

import docker

from trajflow.sandbox.builder.docker_build import Progress, build_lock, digest, image_exists, quiet, run_logged

BASE_REPO = "trajflow-base"

BASE_SUITE = "bookworm"

BASE_VARIANT = "minbase"

BASE_PACKAGES: tuple[str, ...] = ("python3",)

BASE_FORMAT = 1
"""Bump when the way the base layer is made changes (cleanup steps, import changes)."""

DEFAULT_MIRROR = "http://deb.debian.org/debian"


def base_image_tag() -> str:
    """The tag of the base layer; depends only on what defines the layer."""
    parts = {"suite": BASE_SUITE, "variant": BASE_VARIANT, "packages": BASE_PACKAGES, "format": BASE_FORMAT}
    return f"{BASE_REPO}:{digest(parts)}"


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


def build_base_image(client: docker.DockerClient, cache_dir: Path, tag: str, progress: Progress) -> None:
    """debootstrap a minimal Debian with python3 and `docker import` it as `tag` (needs root)."""
    mirror = debian_mirror()
    started = time.monotonic()
    progress(f"building base image {tag} with debootstrap from {mirror}")
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix="rootfs-") as work:
        rootfs = Path(work) / "rootfs"
        include = ",".join(BASE_PACKAGES)
        cmd = ["debootstrap", f"--variant={BASE_VARIANT}", f"--include={include}", BASE_SUITE, str(rootfs), mirror]
        run_logged(cmd, progress, "debootstrap")
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


def ensure_base_image(client: docker.DockerClient, cache_dir: Path, progress: Progress | None = None) -> str:
    """The base image tag, building the base layer (under the build lock) if it is missing."""
    base = base_image_tag()
    if image_exists(client, base):
        return base
    with build_lock(Path(cache_dir)):
        if not image_exists(client, base):  # another caller may have built it while we waited
            build_base_image(client, Path(cache_dir), base, progress or quiet)
    return base
