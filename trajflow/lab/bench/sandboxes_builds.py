"""The image figures of `trajflow bench sandbox`: what resolving the images costs when every layer is cached, and
each sandbox image layer built cold under throwaway tags (on the bench's own copy of the layer below), timed,
and every image this made removed again.

Not covered: Docker's own build cache for layers not built here (a relabelled stand-in defeats it for the layers
that are); the wheel download is timed once, for the runtime layer.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
import docker.errors

from trajflow.contracts.env_ids import SHELL_PREFIX
from trajflow.lab.bench.sandboxes_report import LAYERS
from trajflow.sandbox.builder.base import base_image_tag, build_base_image
from trajflow.sandbox.builder.docker_build import build_from_context
from trajflow.sandbox.images import (
    build_runtime_image,
    build_task_image,
    download_wheels,
    ensure_runtime_image,
    image_for_env,
)

if TYPE_CHECKING:
    from trajflow.lab.bench.sandboxes import Plan

Say = Callable[[str], None]


def measure_cached(client: docker.DockerClient, cache_dir: Path, env_id: str, reps: int = 5) -> dict[str, Any]:
    """What an env worker pays for its images when every layer is cached: hashes + exists, no build."""
    runtime, env_image = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        ensure_runtime_image(client, cache_dir)
        t1 = time.perf_counter()
        image_for_env(client, cache_dir, env_id)
        runtime.append(t1 - t0)
        env_image.append(time.perf_counter() - t1)
    totals = [a + b for a, b in zip(runtime, env_image, strict=True)]
    detail = {"ensure_runtime_image": statistics.median(runtime), "image_for_env": statistics.median(env_image)}
    return {"cached_build_s": statistics.median(totals), "cached_build_detail_s": detail}


def _quiet(_: str) -> None:
    return None


def _every(say: Say, seconds: float = 10.0) -> Callable[[str], None]:
    """A build progress callback that passes on at most one line every `seconds`."""
    last = [0.0]

    def progress(line: str) -> None:
        if time.monotonic() - last[0] >= seconds:
            last[0] = time.monotonic()
            say(f"  {line[:150]}")

    return progress


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def _stand_in(client: docker.DockerClient, scratch: Path, source: str, tag: str, nonce: str) -> str:
    """A relabelled copy of cached layer `source`: the same files under a new image id, so Docker's build cache
    cannot serve a layer built on it."""
    dockerfile = f"FROM {source}\nLABEL trajflow.bench={nonce}\n"
    build_from_context(
        client, scratch, tag=tag, wheels=None, files={}, dockerfile=dockerfile, labels={}, progress=_quiet
    )
    return tag


def _build_task(client: docker.DockerClient, scratch: Path, runtime: str, name: str, tag: str, say: Say) -> None:
    """Shell task `name`'s layer on `runtime` under `tag`, built as `ensure_task_image` builds it."""
    build_task_image(client, scratch, runtime, name, tag, _every(say), labels={"trajflow.bench": "1"})


def remove_images(client: docker.DockerClient, tags: Sequence[str]) -> int:
    """Remove the images tagged `tags` (those that exist) and every image descending from them, children first:
    the intermediate images their builds left too. Nothing else: an image not built on one of them stays."""
    mine = set()
    for tag in tags:
        try:
            mine.add(client.images.get(tag).id)
        except docker.errors.ImageNotFound:
            continue
    parent_of = {img["Id"]: img.get("ParentId") or "" for img in client.api.images(all=True)}
    while grown := {i for i, p in parent_of.items() if p in mine and i not in mine}:
        mine |= grown
    removed = 0
    while mine:
        parents = {parent_of.get(i, "") for i in mine}
        leaves = {i for i in mine if i not in parents} or set(mine)
        for image_id in leaves:
            try:
                client.api.remove_image(image_id, force=True, noprune=True)
                removed += 1
            except docker.errors.NotFound:
                pass  # removed meanwhile
        mine -= leaves
    return removed


def measure_builds(
    client: docker.DockerClient, cache_dir: Path, runtime_tag: str, plan: Plan, say: Say
) -> dict[str, Any]:
    """Build each layer of `plan.cold_layers` cold under throwaway tags (wheels downloaded into a scratch cache),
    each on the bench's own layer below it (a relabelled copy of the cached one when that was not built cold),
    then remove every image this made. A failed build is reported in the notes, not raised: the figures measured
    before it are worth keeping."""
    nonce = uuid.uuid4().hex[:10]
    task = plan.env_id.removeprefix(SHELL_PREFIX) if plan.env_id.startswith(SHELL_PREFIX) else None
    tags = {
        "base": f"trajflow-bench-base:{nonce}",
        "runtime": f"trajflow-bench-runtime:{nonce}",
        "task": f"trajflow-bench-task:{task}-{nonce}",
    }
    below = {"runtime": ("base", base_image_tag()), "task": ("runtime", runtime_tag)}
    seconds: dict[str, float | None] = dict.fromkeys(LAYERS)
    notes: dict[str, str] = {}
    wheels: list[float] = []
    scratch = Path(tempfile.mkdtemp(dir=cache_dir, prefix="bench-"))

    def build(layer: str, parent: str) -> None:
        if layer == "base":
            build_base_image(client, scratch, tags["base"], _every(say))
        elif layer == "runtime":
            wheels.append(_timed(lambda: download_wheels(scratch, _every(say))))
            build_runtime_image(client, scratch, parent, tags["runtime"], _every(say))
        else:
            _build_task(client, scratch, parent, task or "", tags["task"], say)

    parent: str | None = None  # the bench's own image that the next layer builds on
    try:
        for layer in LAYERS:
            if layer == "task" and task is None:
                notes[layer] = "a GEM env runs on the runtime layer: it has no task layer"
                continue
            if layer not in plan.cold_layers:
                quick = layer == "base" and plan.quick
                notes[layer] = "not built cold in --quick (debootstrap takes minutes)" if quick else "not built cold"
                parent = None
                continue
            if layer != "base" and parent is None:
                lower, cached = below[layer]
                parent = _stand_in(client, scratch, cached, f"trajflow-bench-{lower}:{nonce}-copy", nonce)
            say(f"layer builds: {layer}" + (f" on {parent}" if parent else " (debootstrap + docker import; minutes)"))
            try:
                seconds[layer] = _timed(lambda: build(layer, parent or ""))  # noqa: B023 — called right here
                parent = tags[layer]
            except (RuntimeError, OSError, docker.errors.DockerException) as e:
                notes[layer] = f"cold build failed: {type(e).__name__}: {e}"[:800]
                say(f"layer builds: {layer} FAILED: {notes[layer]}")
                parent = None
    finally:
        made = [*tags.values(), *(f"trajflow-bench-{lower}:{nonce}-copy" for lower in ("base", "runtime"))]
        removed = remove_images(client, made)
        shutil.rmtree(scratch, ignore_errors=True)
    built = ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items() if v is not None) or "nothing"
    say(f"layer builds: {built}; removed the {removed} images they made")
    return {
        "layer_build_s": seconds,
        "wheel_download_s": wheels[0] if wheels else None,
        "layer_build_notes": notes,
        "bench_images_removed": removed,
    }
