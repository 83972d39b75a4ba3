"""What `trajflow images build|list|prune` do and print: the sandbox layers (`trajflow.sandbox.layers`) on this
machine's Docker engine, with the image cache under the process settings' cache dir. `trajflow/cli/` imports no core
package itself (tests/unit/test_import_rules.py), so its commands call these.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from trajflow.infra.settings import load_settings
from trajflow.infra.setup import docker_client
from trajflow.sandbox.images import Progress, UnknownTask
from trajflow.sandbox.layers import build_all, list_images, prune_images

__all__ = ["UnknownTask", "build", "build_reward", "build_worker", "listing", "prune"]


def build_reward(progress: Progress) -> str:
    """Build (or find cached) the reward service's container image; returns its tag."""
    from trajflow.sandbox.builder.reward_image import ensure_reward_image

    return ensure_reward_image(docker_client(), load_settings().cache_dir / "images", progress=progress)


def build_worker(progress: Progress, cuda: bool = False) -> str:
    """Build (or find cached) the worker image, or with `cuda` its CUDA variant; returns its tag."""
    from trajflow.sandbox.builder.worker_image import ensure_worker_image

    return ensure_worker_image(docker_client(), load_settings().cache_dir / "images", progress, cuda=cuda)


def build(tasks: list[str] | None, progress: Progress) -> list[str]:
    """Build the missing layers; one line per layer: name, tag, cached or built in how long. Raises `UnknownTask`."""
    layers = build_all(docker_client(), load_settings().cache_dir / "images", tasks, progress)
    width = max(len(layer.tag) for layer in layers.values())
    return [
        f"{name:24} {layer.tag:{width}}  {'cached' if layer.cached else f'built in {layer.seconds:.1f}s'}"
        for name, layer in layers.items()
    ]


def listing(as_json: bool) -> str:
    """The layer images as a table (or JSON): layer, tag, size, created, current or stale, in use."""
    found = list_images(docker_client(), load_settings().cache_dir / "images")
    if as_json:
        return json.dumps([asdict(info) for info in found], indent=2)
    width = max([len("TAG"), *(len(info.tag) for info in found)])
    lines = [f"{'LAYER':8} {'TAG':{width}} {'SIZE MB':>8}  {'CREATED (UTC)':16}  {'STATE':7}  IN USE"]
    for info in found:
        created = info.created[:16].replace("T", " ")
        state = "current" if info.current else "stale"
        in_use = "yes" if info.in_use else "no"
        lines.append(f"{info.layer:8} {info.tag:{width}} {info.size_mb:8.1f}  {created:16}  {state:7}  {in_use}")
    return "\n".join(lines)


def prune(tags: list[str] | None, dry_run: bool, progress: Progress) -> str:
    """Remove the stale layers (those named, when any), reporting each; returns the summary line."""
    cache_dir = load_settings().cache_dir / "images"
    removed = prune_images(docker_client(), cache_dir, dry_run=dry_run, progress=progress, only=tags)
    return f"{'would remove' if dry_run else 'removed'} {len(removed)} stale layer(s)"
