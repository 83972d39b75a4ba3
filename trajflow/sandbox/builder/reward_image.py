"""A locally built, content-hashed container image of the reward service: `trajflow-reward:<hash>`.

It is the proof that `trajflow.rewards.service` runs on any platform that serves an HTTP container: the image starts
the service with `python3 -m trajflow.rewards.service`, which listens on `$HOST` (`0.0.0.0` in the image) and `$PORT`
(8080 unless the platform sets it), as an unprivileged user (uid 65534, nobody), with nothing else in it.

How it is made (no image registry is reachable, so everything is built here):
- `FROM` the Debian base layer that the sandbox layers use too (`trajflow.sandbox.builder.base.ensure_base_image`:
  bookworm minbase + python3, no pip).
- The service's runtime dependencies, pinned to the versions in the project's environment, are fetched on the
  host with `pip wheel` (`trajflow.sandbox.builder.wheels.download_wheels`) and installed by a build stage with pip run
  from its own wheel, so the wheels and pip stay out of the final image.
- The sources of the `trajflow.rewards` and `trajflow.contracts` packages and of `trajflow.envs.verify` (the
  verifier rewards' answer checkers), read where Python imports them from (an installed wheel or a checkout), are
  copied in (and byte-compiled).
The tag is a hash of the base tag, the requirements, the wheels' sha256, the copied sources and the Dockerfile
text, so it rebuilds only when one of them changes; a cached call costs a few file hashes and image lookups.

Concurrency: an fcntl lock in `cache_dir` makes many callers (threads or processes) build once.
Limits: the same as `imagebuild` (Linux x86_64, CPython 3.11 on the host to match the image's Python 3.11;
building a missing base layer needs root). Reward functions that need more than these packages (verifiers,
models) need their wheels added to `REWARD_REQUIREMENTS`. Old images are never garbage-collected here, and
the image is never pushed: publishing it to a platform's registry is the deployment's job.
"""

from __future__ import annotations

import hashlib
import importlib.util
import time
from importlib import resources
from pathlib import Path

import docker

from trajflow.sandbox.builder.base import ensure_base_image
from trajflow.sandbox.builder.docker_build import (
    UNPRIVILEGED_UID,
    Progress,
    build_from_context,
    digest,
    file_lock,
    image_exists,
    quiet,
)
from trajflow.sandbox.builder.wheels import (
    PIP_REQUIREMENT,
    cached_wheels,
    download_wheels,
    wheel_build_stage,
    wheel_dir,
)

REWARD_REPO = "trajflow-reward"
REWARD_FORMAT = 1
"""Bump when the image changes in a way that the hashed inputs (Dockerfile text, sources, wheels) do not show."""

REWARD_REQUIREMENTS: tuple[str, ...] = (
    # what trajflow.rewards.service, trajflow.rewards.registry and contracts import, pinned as in the lock files ...
    "fastapi==0.165.0",
    "uvicorn==0.54.0",
    "pydantic==2.13.4",
    # ... and their dependencies, pinned to the versions installed with them in the project's environment
    "starlette==1.10.0",
    "pydantic-core==2.46.4",
    "annotated-types==0.8.0",
    "annotated-doc==0.0.7",
    "typing-extensions==4.16.0",
    "typing-inspection==0.4.5",
    "anyio==4.16.0",
    "idna==3.20",
    "h11==0.16.0",
    "click==8.5.1",
    "opentelemetry-api==1.45.2",
    # the reward models' HTTP client (trajflow.rewards.model_http: LLM judges, local reward-model servers)
    "httpx==0.28.1",
    "httpcore==1.0.9",
    "certifi==2026.10.19.post1",
    # the verifier rewards (math_verify, through trajflow/envs/verify.py) and their dependencies
    "math-verify==0.9.0",
    "latex2sympy2_extended==1.11.0",
    "antlr4-python3-runtime==4.13.2",
    "sympy==1.14.0",
    "mpmath==1.3.0",
)

SOURCE_PACKAGES: tuple[str, ...] = ("trajflow.contracts", "trajflow.rewards")
"""The project's packages copied into the image whole (the local reward models' server, `trajflow.rewards.models`,
left out: it runs elsewhere, on torch)."""
SOURCE_MODULES: tuple[str, ...] = ("trajflow", "trajflow.envs", "trajflow.envs.verify")
"""Single modules copied beside them: the namespace's and the envs package's `__init__`, and the answer checkers of
the verifier rewards (the service imports nothing else of the project)."""
LEFT_OUT = ("trajflow.rewards.models",)
APP_DIR = "/opt/trajflow/app"
SITE_DIR = "/opt/trajflow/site"
DEFAULT_PORT = 8080
SERVICE_UID = UNPRIVILEGED_UID
"""The unprivileged user (nobody) that the service runs as."""


def _module_file(module: str) -> tuple[str, Path]:
    """(path relative to the install root, file) of a module, or of a package's `__init__`, where Python imports it
    from."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(module)
    origin = Path(spec.origin)
    parts = module.split(".")
    rel = [*parts, "__init__.py"] if origin.name == "__init__.py" else [*parts[:-1], origin.name]
    return "/".join(rel), origin


def source_files() -> dict[str, bytes]:
    """{path relative to the install root: content} of every `.py` file of the copied packages and modules, read
    where Python imports them from (an installed wheel or a checkout)."""
    files: dict[str, bytes] = {}
    for package in SOURCE_PACKAGES:
        root = Path(str(resources.files(package)))
        prefix = package.replace(".", "/")
        for path in sorted(root.rglob("*.py")):
            rel = f"{prefix}/{path.relative_to(root).as_posix()}"
            if "__pycache__" not in path.parts and not any(rel.startswith(m.replace(".", "/") + "/") for m in LEFT_OUT):
                files[rel] = path.read_bytes()
    for module in SOURCE_MODULES:
        rel, path = _module_file(module)
        files[rel] = path.read_bytes()
    return files


def reward_dockerfile(base_tag: str, wheel_names: list[str]) -> str:
    """The image's Dockerfile; a build stage installs the wheels so they (and pip) stay out of the image."""
    return (
        wheel_build_stage(base_tag, wheel_names, REWARD_REQUIREMENTS, SITE_DIR)
        + f"""\
COPY app/ {APP_DIR}/
RUN python3 -m compileall -q {APP_DIR}

FROM {base_tag}
COPY --from=build {SITE_DIR} {SITE_DIR}
COPY --from=build {APP_DIR} {APP_DIR}
ENV PYTHONPATH={APP_DIR}:{SITE_DIR} HOME=/tmp PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \\
    HOST=0.0.0.0 PORT={DEFAULT_PORT}
WORKDIR /tmp
USER {SERVICE_UID}:{SERVICE_UID}
EXPOSE {DEFAULT_PORT}
CMD ["python3", "-m", "trajflow.rewards.service"]
"""
    )


def reward_image_tag(base_tag: str, wheel_hashes: dict[str, str], sources: dict[str, bytes]) -> str:
    """The tag of the reward image built on `base_tag` from these wheels and these sources."""
    parts = {
        "base": base_tag,
        "requirements": REWARD_REQUIREMENTS,
        "pip": PIP_REQUIREMENT,
        "wheels": wheel_hashes,
        "sources": {name: hashlib.sha256(data).hexdigest() for name, data in sources.items()},
        "dockerfile": reward_dockerfile(base_tag, sorted(wheel_hashes)),
        "format": REWARD_FORMAT,
    }
    return f"{REWARD_REPO}:{digest(parts)}"


def build_reward_image(
    client: docker.DockerClient, cache_dir: Path, base_tag: str, sources: dict[str, bytes], tag: str, progress: Progress
) -> None:
    """Build `tag` from the cached wheels and `sources`."""
    started = time.monotonic()
    progress(f"building reward image {tag} on {base_tag}")
    wheels = wheel_dir(cache_dir, REWARD_REQUIREMENTS)
    build_from_context(
        client,
        cache_dir,
        tag=tag,
        wheels=wheels,
        files={f"app/{name}": data for name, data in sources.items()},
        dockerfile=reward_dockerfile(base_tag, sorted(p.name for p in wheels.glob("*.whl"))),
        labels={"trajflow.layer": "reward", "trajflow.hash": tag.partition(":")[2], "trajflow.base": base_tag},
        progress=progress,
    )
    progress(f"built reward image {tag} in {time.monotonic() - started:.1f}s")


def _cached_tag(client: docker.DockerClient, cache_dir: Path, base_tag: str, sources: dict[str, bytes]) -> str | None:
    hashes = cached_wheels(cache_dir, REWARD_REQUIREMENTS)
    if hashes is None:
        return None
    tag = reward_image_tag(base_tag, hashes, sources)
    return tag if image_exists(client, tag) else None


def ensure_reward_image(client: docker.DockerClient, cache_dir: Path, progress: Progress | None = None) -> str:
    """The reward image tag, building the base layer, the wheels and the reward image where missing."""
    report = progress or quiet
    cache_dir = Path(cache_dir)
    base = ensure_base_image(client, cache_dir, report)
    sources = source_files()
    tag = _cached_tag(client, cache_dir, base, sources)
    if tag is not None:
        report(f"reward image {tag} is cached")
        return tag
    with file_lock(cache_dir / ".reward-build.lock"):
        tag = _cached_tag(client, cache_dir, base, sources)  # another caller may have built it while we waited
        if tag is not None:
            report(f"reward image {tag} was built by another caller")
            return tag
        hashes = cached_wheels(cache_dir, REWARD_REQUIREMENTS)
        if hashes is None:
            hashes = download_wheels(cache_dir, report, REWARD_REQUIREMENTS)
        tag = reward_image_tag(base, hashes, sources)
        if not image_exists(client, tag):
            build_reward_image(client, cache_dir, base, sources, tag, report)
        return tag


__all__ = ["REWARD_REQUIREMENTS", "ensure_reward_image", "reward_dockerfile", "reward_image_tag", "source_files"]
