"""npm packages for image layers (`trajflow.sandbox.builder.npm`) against a registry served on loopback (the code
around the registry: what it resolves, refuses, fetches and checks), and `npm-packages.txt` / `debian-packages.txt`
read from a user env's directory (`trajflow.sandbox.user.source.read_system_packages`) into the layer's Dockerfile.
The real registry and image build are `tests/integration/test_harnesses.py`'s (the Codex CLI)."""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trajflow.sandbox.builder import npm
from trajflow.sandbox.user.source import EnvSourceError, read_system_packages
from trajflow.sandbox.user_images import user_dockerfile


def tarball(files: dict[str, str]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"package/{name}")
            info.size, info.mode = len(data), 0o755 if name.startswith("bin/") else 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


class Registry:
    """Package entries (NAME/VERSION -> JSON) and tarballs (/t/FILE -> bytes) on a loopback HTTP server."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}
        self.tarballs: dict[str, bytes] = {}
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None: ...

            def do_GET(self) -> None:
                path = self.path.replace("%2f", "/").replace("%2F", "/")
                body = registry.tarballs.get(path) or (
                    json.dumps(registry.entries[path[1:]]).encode() if path[1:] in registry.entries else None
                )
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                self.wfile.write(body or b"{}")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def publish(self, name: str, version: str, files: dict[str, str], **fields: Any) -> None:
        data = tarball({"package.json": json.dumps({"name": name, "version": version, **fields}), **files})
        path = f"/t/{name.replace('/', '-')}-{version}.tgz"
        self.tarballs[path] = data
        dist = {"tarball": self.url + path, "integrity": integrity(data)}
        self.entries[f"{name}/{version}"] = {"name": name, "version": version, "dist": dist, **fields}


@pytest.fixture()
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    r = Registry()
    monkeypatch.setenv("TRAJFLOW_NPM_REGISTRY", r.url)
    yield r
    r.server.shutdown()


def harness(registry: Registry) -> None:
    """A harness shaped like Codex: a wrapper whose pinned optional dependencies are per-platform binaries."""
    optional = {"@x/tool-linux-x64": "npm:@x/tool@1.2.3-linux-x64", "@x/tool-darwin-arm64": "1.2.3", "sharp": "^0.3"}
    registry.publish("@x/tool", "1.2.3", {"bin/tool.js": "#!/usr/bin/env node\n"}, bin={"tool": "bin/tool.js"},
                     optionalDependencies=optional)  # fmt: skip
    registry.publish("@x/tool", "1.2.3-linux-x64", {"vendor/tool": "ELF"}, os=["linux"], cpu=["x64"])
    registry.publish("@x/tool-darwin-arm64", "1.2.3", {"vendor/tool": "Mach-O"}, os=["darwin"], cpu=["arm64"])


def test_a_harness_resolves_to_itself_and_its_linux_x64_binary(registry: Registry) -> None:
    harness(registry)
    got = [(t.install_as, t.name, t.version) for t in npm.resolve(("@x/tool@1.2.3",))]
    assert got == [("@x/tool", "@x/tool", "1.2.3"), ("@x/tool-linux-x64", "@x/tool", "1.2.3-linux-x64")]


def test_fetched_tarballs_are_checked_and_install_without_npm(registry: Registry, tmp_path: Path) -> None:
    harness(registry)
    manifest = npm.download_tarballs(tmp_path, ("@x/tool@1.2.3",), print)
    assert npm.cached_tarballs(tmp_path, ("@x/tool@1.2.3",)) == manifest
    folder = npm.tarball_dir(tmp_path, ("@x/tool@1.2.3",))
    (folder / "install.py").write_text(npm.INSTALL)  # what the build stage runs, with this Python
    subprocess.run([sys.executable, str(folder / "install.py"), str(folder), str(tmp_path / "prefix")], check=True)
    modules = tmp_path / "prefix" / "node_modules"
    assert (modules / "@x" / "tool-linux-x64" / "vendor" / "tool").read_text() == "ELF"
    command = tmp_path / "prefix" / "bin" / "tool"
    assert command.resolve() == (modules / "@x" / "tool" / "bin" / "tool.js") and command.stat().st_mode & 0o111


def test_a_tarball_that_is_not_the_registrys_is_refused(registry: Registry, tmp_path: Path) -> None:
    registry.publish("plain", "1.0.0", {"index.js": ""})
    registry.tarballs["/t/plain-1.0.0.tgz"] = tarball({"package.json": "{}", "index.js": "tampered"})
    with pytest.raises(npm.NpmError, match="sha512 is not the registry's integrity"):
        npm.download_tarballs(tmp_path, ("plain@1.0.0",), print)
    assert npm.cached_tarballs(tmp_path, ("plain@1.0.0",)) is None


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("deps@1.0.0", "has dependencies (left-pad): not supported"),
        ("missing@9.9.9", "the registry did not answer"),
        ("loose@^1.0.0", "exact version"),
        ("nover", "NAME@VERSION"),
    ],
)
def test_what_this_installer_cannot_install_is_refused_saying_why(registry: Registry, spec: str, says: str) -> None:
    registry.publish("deps", "1.0.0", {}, dependencies={"left-pad": "^1.3.0"})
    with pytest.raises(npm.NpmError, match=says.replace("(", r"\(").replace(")", r"\)").replace("^", r"\^")):
        npm.resolve((spec,))


def test_system_packages_are_read_checked_and_built_into_the_layer(tmp_path: Path) -> None:
    (tmp_path / "debian-packages.txt").write_text("# tools\nripgrep\n\ngit  # for the repo\n")
    (tmp_path / "npm-packages.txt").write_text("@openai/codex@0.171.0\n")
    debian, specs = read_system_packages(tmp_path)
    assert (debian, specs) == (("ripgrep", "git"), ("@openai/codex@0.171.0",))
    dockerfile = user_dockerfile("runtime:1", [], (), debian, with_npm=True)
    assert "apt-get install -y --no-install-recommends ripgrep git nodejs" in dockerfile
    assert (
        f"COPY --from=npm {npm.NPM_PREFIX} {npm.NPM_PREFIX}" in dockerfile
        and "ENV PATH=/opt/trajflow/npm/bin:" in dockerfile
    )
    assert "apt-get" not in user_dockerfile("runtime:1", [], ()) and "npm" not in user_dockerfile("runtime:1", [], ())
    (tmp_path / "debian-packages.txt").write_text("nodejs=18.19\n")
    with pytest.raises(EnvSourceError, match=r"debian-packages.txt:1: 'nodejs=18.19' is not a Debian package name"):
        read_system_packages(tmp_path)
