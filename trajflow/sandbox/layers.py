"""Managing the sandbox image layers (`trajflow images build|list|prune`); the layers themselves are made in
`trajflow/sandbox/images.py` (on `trajflow/sandbox/builder/`).

`build_all` builds every layer that is missing, `list_images` finds the layers by repository name and marks each
current (what today's sources and wheel cache hash to) or stale, and `prune_images` removes the stale ones,
children first, keeping any that a container uses. "Current" is relative to this checkout and this cache:
another checkout's layers look stale from here. The layers of users' envs and datasets (`user_images.py`, built
from a run's package) are current while the runtime they are built on is: which packages runs will still name
cannot be known here, so they go when the runtime does.
Limits: intermediate images that a build leaves untagged are not tracked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Literal

import docker
import docker.errors

from trajflow.sandbox.builder.base import BASE_REPO, base_image_tag, ensure_base_image
from trajflow.sandbox.builder.docker_build import Progress, image_exists
from trajflow.sandbox.images import (
    RUNTIME_REPO,
    TASK_REPO,
    cached_runtime_tag,
    cached_wheels,
    ensure_runtime_image,
    ensure_task_image,
    runtime_image_tag,
    runtime_sources,
    shell_task_names,
    task_files,
    task_image_tag,
)
from trajflow.sandbox.user_images import USER_REPO

Layer = Literal["base", "runtime", "task", "userenv"]
LAYER_REPOS: dict[str, Layer] = {BASE_REPO: "base", RUNTIME_REPO: "runtime", TASK_REPO: "task", USER_REPO: "userenv"}
LAYERS: tuple[Layer, ...] = ("base", "runtime", "task", "userenv")
"""Parents before children."""


@dataclass(frozen=True)
class LayerBuild:
    """One layer as `build_all` left it."""

    tag: str
    cached: bool
    """It was there already: nothing was built."""
    seconds: float


def _timed(cached: bool, ensure: Callable[[], str]) -> LayerBuild:
    started = time.monotonic()
    tag = ensure()
    return LayerBuild(tag, cached, time.monotonic() - started)


def build_all(
    client: docker.DockerClient, cache_dir: Path, tasks: list[str] | None = None, progress: Progress | None = None
) -> dict[str, LayerBuild]:
    """Build whatever is missing of the base, the runtime and the layer of each named shell task (default: every
    shipped one); returns layer -> what was done, keyed "base", "runtime", "task:<name>". An unknown task name
    raises `UnknownTask` before anything is built."""
    cache_dir = Path(cache_dir)
    names = shell_task_names() if tasks is None else list(tasks)
    files = {name: task_files(name) for name in names}
    base_cached = image_exists(client, base_image_tag())
    runtime_cached = cached_runtime_tag(client, cache_dir) is not None
    layers = {"base": _timed(base_cached, partial(ensure_base_image, client, cache_dir, progress))}
    layers["runtime"] = _timed(runtime_cached, partial(ensure_runtime_image, client, cache_dir, progress))
    for name in names:
        cached = image_exists(client, task_image_tag(layers["runtime"].tag, name, files[name]))
        layers[f"task:{name}"] = _timed(cached, partial(ensure_task_image, client, cache_dir, name, progress))
    return layers


def current_tags(cache_dir: Path) -> set[str]:
    """The tags that today's sources hash to: the base, and, when the wheel cache is there (without it the
    runtime's tag is unknown), the runtime and every shipped task's layer on it. Builds nothing."""
    base = base_image_tag()
    hashes = cached_wheels(Path(cache_dir))
    if hashes is None:
        return {base}
    runtime = runtime_image_tag(base, hashes, runtime_sources())
    return {base, runtime, *(task_image_tag(runtime, name, task_files(name)) for name in shell_task_names())}


@dataclass(frozen=True)
class ImageInfo:
    """One tag of a layer image on the Docker engine."""

    tag: str
    layer: Layer
    size_mb: float
    """The whole image, the layers it shares with its parents included (as `docker images` counts)."""
    created: str
    """ISO 8601, UTC, to the second."""
    current: bool
    """What today's sources hash to (`current_tags`); otherwise stale."""
    in_use: bool
    """A container, running or not, was created from this image."""
    parent: str | None = None
    """The layer it is built on (its `trajflow.base` label; the base layer has none)."""


def list_images(client: docker.DockerClient, cache_dir: Path) -> list[ImageInfo]:
    """Every tag in the trajflow-base, trajflow-runtime, trajflow-task and trajflow-userenv repositories, base
    first; a userenv layer is current when the runtime it is built on is."""
    current = current_tags(cache_dir)
    used = {container["ImageID"] for container in client.api.containers(all=True)}
    found: list[ImageInfo] = []
    for repo, layer in LAYER_REPOS.items():
        for image in client.api.images(name=repo):  # the summaries: no inspect per image
            created = datetime.fromtimestamp(image["Created"], UTC).isoformat(timespec="seconds")
            parent = (image.get("Labels") or {}).get("trajflow.base")
            for tag in image.get("RepoTags") or ():
                if tag.partition(":")[0] != repo:  # the same image may carry other names too
                    continue
                found.append(
                    ImageInfo(
                        tag=tag,
                        layer=layer,
                        size_mb=round(image["Size"] / 1e6, 1),
                        created=created,
                        current=(parent in current) if layer == "userenv" else tag in current,
                        in_use=image["Id"] in used,
                        parent=parent,
                    )
                )
    return sorted(found, key=lambda info: (LAYERS.index(info.layer), info.tag))


@dataclass(frozen=True)
class PruneStep:
    """What pruning does with one stale layer, and why."""

    tag: str
    remove: bool
    reason: str


def plan_prune(images: list[ImageInfo]) -> list[PruneStep]:
    """What pruning does with each stale layer, in the order to do it: task layers, then runtime, then base, so
    a child goes before its parent. A stale layer stays when a container uses it or a layer that stays is built
    on it (removing it would only untag it). Current layers are not in the plan."""
    stays_on = {info.parent: info.tag for info in images if info.current and info.parent}
    steps: list[PruneStep] = []
    for info in sorted((i for i in images if not i.current), key=lambda i: (-LAYERS.index(i.layer), i.tag)):
        if info.in_use:
            steps.append(PruneStep(info.tag, False, "a container uses it"))
        elif info.tag in stays_on:
            steps.append(PruneStep(info.tag, False, f"{stays_on[info.tag]} is built on it"))
        else:
            steps.append(PruneStep(info.tag, True, "stale"))
            continue
        if info.parent:
            stays_on.setdefault(info.parent, info.tag)
    return steps


def prune_images(
    client: docker.DockerClient,
    cache_dir: Path,
    dry_run: bool = False,
    progress: Progress | None = None,
    only: Collection[str] | None = None,
) -> list[str]:
    """Remove the stale layers as `plan_prune` orders them (only those named in `only`, when given); returns the
    tags removed (with `dry_run`, that would be) and reports each kept one. Without a wheel cache the current
    runtime is unknown, so runtime and task layers are all kept. Docker's own refusal (a container created since
    the listing) keeps a layer too."""
    report = progress or (lambda _: None)
    images = list_images(client, cache_dir)
    if cached_wheels(Path(cache_dir)) is None:
        report(f"no wheel cache in {cache_dir}: the current runtime is unknown, so no runtime or task layer is pruned")
        images = [info if info.layer == "base" else replace(info, current=True) for info in images]
    steps = plan_prune(images)
    if only is not None:
        planned = {step.tag for step in steps}
        for tag in sorted(set(only) - planned):
            report(f"left {tag}: not a stale trajflow layer")
        steps = [step for step in steps if step.tag in only]
    removed: list[str] = []
    for step in steps:
        if not step.remove:
            report(f"kept {step.tag}: {step.reason}")
            continue
        if not dry_run:
            try:
                client.images.remove(step.tag)
            except docker.errors.ImageNotFound:
                report(f"gone {step.tag}: removed by someone else meanwhile")
                continue
            except docker.errors.APIError as e:
                if e.status_code != 409:  # 409 Conflict: Docker refuses to remove an image a container uses
                    raise
                report(f"kept {step.tag}: {e.explanation}")
                continue
        report(f"{'would remove' if dry_run else 'removed'} {step.tag}")
        removed.append(step.tag)
    return removed
