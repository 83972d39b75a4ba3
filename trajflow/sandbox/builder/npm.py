"""npm packages for an image layer (a harness shipped on npm: `@openai/codex`, `@anthropic-ai/claude-code`), fetched on
the host from the registry and installed in a build stage without npm, so the sandbox needs Node only to run them.

`resolve` reads each pinned package's registry entry (`NAME@VERSION`, an exact version), refuses one with
`dependencies` (this installer does not resolve version ranges), and adds its `optionalDependencies` that are pinned
(an exact version or an `npm:NAME@VERSION` alias: the per-platform binaries that Codex and Claude Code ship) and made
for Linux on x86_64 (their `os` and `cpu` fields); optional dependencies given as ranges are left out, as npm would
leave them out where they fail to install. `download_tarballs` fetches each tarball into the cache (one directory per
package set, complete once its manifest.json exists) and checks it against the registry's sha512 `integrity`.
`npm_build_stage` unpacks them into /opt/trajflow/npm/node_modules/NAME and links each package's `bin` entries into
/opt/trajflow/npm/bin (with the runtime's python3: Debian's 3.11.2, whose tarfile has no extraction filter, so the
script checks every member itself).

Limits: the registry is `TRAJFLOW_NPM_REGISTRY` (default https://registry.npmjs.org), read without authentication;
no install scripts run (`postinstall`); packages with dependencies are refused.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajflow.sandbox.builder.docker_build import Progress, digest, publish_dir

NPM_PREFIX = "/opt/trajflow/npm"
DEFAULT_REGISTRY = "https://registry.npmjs.org"
PLATFORM = ("linux", "x64")
EXACT = re.compile(r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")
SPEC = re.compile(r"^(@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*@\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")
FETCH_TIMEOUT_S = 120.0


class NpmError(ValueError):
    """A package that this installer cannot install; the message says which and why."""


@dataclass(frozen=True)
class Tarball:
    install_as: str
    """Its directory under node_modules (an optional dependency's alias, else its name)."""
    name: str
    version: str
    url: str
    integrity: str


def registry() -> str:
    return os.environ.get("TRAJFLOW_NPM_REGISTRY", DEFAULT_REGISTRY).rstrip("/")


def check_spec(spec: str) -> None:
    """Raise NpmError unless `spec` is `NAME@VERSION` with an exact version."""
    if not SPEC.match(spec):
        raise NpmError(
            f"{spec!r}: an npm package is pinned as NAME@VERSION with an exact version, e.g. @openai/codex@0.171.0"
        )


def _entry(name: str, version: str) -> dict[str, Any]:
    url = f"{registry()}/{urllib.parse.quote(name, safe='@')}/{urllib.parse.quote(version)}"
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
            entry: dict[str, Any] = json.load(response)
    except OSError as e:
        raise NpmError(f"{name}@{version}: the registry did not answer ({url}: {e})") from e
    return entry


def _fits(entry: dict[str, Any]) -> bool:
    os_ok = not entry.get("os") or PLATFORM[0] in entry["os"]
    return bool(os_ok and (not entry.get("cpu") or PLATFORM[1] in entry["cpu"]))


def _tarball(install_as: str, entry: dict[str, Any]) -> Tarball:
    name, version = entry["name"], entry["version"]
    if entry.get("dependencies"):
        raise NpmError(
            f"{name}@{version} has dependencies ({', '.join(sorted(entry['dependencies']))}): not supported; pin a "
            "package that bundles them (Codex and Claude Code do)"
        )
    dist = entry.get("dist") or {}
    if not str(dist.get("integrity", "")).startswith("sha512-"):
        raise NpmError(f"{name}@{version}: the registry gives no sha512 integrity to check its tarball against")
    return Tarball(install_as, name, version, dist["tarball"], dist["integrity"])


def resolve(specs: tuple[str, ...]) -> list[Tarball]:
    """Each pinned package and its pinned Linux x86_64 optional dependencies, as tarballs to fetch."""
    out: list[Tarball] = []
    for spec in specs:
        check_spec(spec)
        name, _, version = spec.rpartition("@")
        entry = _entry(name, version)
        out.append(_tarball(name, entry))
        for alias, wanted in sorted((entry.get("optionalDependencies") or {}).items()):
            real, _, pinned = str(wanted).removeprefix("npm:").rpartition("@")
            real, pinned = (real, pinned) if str(wanted).startswith("npm:") else (alias, str(wanted))
            if not EXACT.match(pinned):
                continue  # a range: left out (an optional dependency)
            optional = _entry(real, pinned)
            if _fits(optional):
                out.append(_tarball(alias, optional))
    return out


def tarball_dir(cache_dir: Path, specs: tuple[str, ...]) -> Path:
    return cache_dir / "npm" / digest({"npm": specs, "platform": PLATFORM})


def cached_tarballs(cache_dir: Path, specs: tuple[str, ...]) -> dict[str, Any] | None:
    """The manifest ({"packages": [{install_as, file, integrity}]}) of a complete download, or None."""
    manifest = tarball_dir(cache_dir, specs) / "manifest.json"
    return json.loads(manifest.read_text()) if manifest.exists() else None


def download_tarballs(cache_dir: Path, specs: tuple[str, ...], progress: Progress) -> dict[str, Any]:
    """Fetch the set's tarballs into the cache, each checked against its integrity; returns the manifest."""
    target = tarball_dir(cache_dir, specs)
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    tarballs = resolve(specs)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix="staging-"))
    try:
        packages = []
        for t in tarballs:
            progress(f"npm: fetching {t.name}@{t.version} ({t.url})")
            file = f"{len(packages):02d}-{t.url.rsplit('/', 1)[-1]}"
            sha = hashlib.sha512()
            with urllib.request.urlopen(t.url, timeout=FETCH_TIMEOUT_S) as response, (staging / file).open("wb") as out:
                while chunk := response.read(1 << 20):
                    sha.update(chunk)
                    out.write(chunk)
            if "sha512-" + base64.b64encode(sha.digest()).decode() != t.integrity:
                raise NpmError(f"{t.name}@{t.version}: the tarball's sha512 is not the registry's integrity")
            packages.append({"install_as": t.install_as, "file": file, "integrity": t.integrity})
        manifest = {"packages": packages}
        publish_dir(staging, target, manifest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    progress(f"npm: fetched {len(tarballs)} tarballs in {time.monotonic() - started:.1f}s")
    return manifest


INSTALL = r"""
import json, os, sys, tarfile
src, prefix = sys.argv[1], sys.argv[2]
for package in json.load(open(os.path.join(src, "manifest.json")))["packages"]:
    root = os.path.join(prefix, "node_modules", package["install_as"])
    with tarfile.open(os.path.join(src, package["file"])) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")[1:]  # the tarball's top directory ("package/") dropped
            if not parts or ".." in parts or member.name.startswith("/"):
                continue
            if not (member.isfile() or member.isdir()):
                continue  # links and devices are not needed by these packages, and not trusted
            path = os.path.join(root, *parts)
            if member.isdir():
                os.makedirs(path, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with tar.extractfile(member) as data, open(path, "wb") as out:
                out.write(data.read())
            os.chmod(path, 0o755 if member.mode & 0o111 else 0o644)
    info = json.load(open(os.path.join(root, "package.json")))
    bins = info.get("bin") or {}
    if isinstance(bins, str):
        bins = {info["name"].rsplit("/", 1)[-1]: bins}
    os.makedirs(os.path.join(prefix, "bin"), exist_ok=True)
    for command, target in bins.items():
        link = os.path.join(prefix, "bin", command)
        os.chmod(os.path.join(root, target), 0o755)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(os.path.join(root, target), link)
"""
"""What the build stage runs (the runtime's python3) to unpack the tarballs and link their commands."""


def npm_build_stage(base_tag: str) -> str:
    """A build stage that installs the context's npm/ tarballs (with install.py) under NPM_PREFIX."""
    return f"""\
FROM {base_tag} AS npm
USER 0
COPY npm/ /n/
RUN python3 /n/install.py /n {NPM_PREFIX}
"""
