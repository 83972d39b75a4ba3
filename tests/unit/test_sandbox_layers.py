"""Listing, pruning and building the image layers (`trajflow.sandbox.layers`), against a fake engine: no Docker."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import docker
import docker.errors
import pytest
import requests

from trajflow.sandbox import images, layers


def _info(tag: str, current: bool = False, in_use: bool = False, parent: str | None = None) -> layers.ImageInfo:
    layer = layers.LAYER_REPOS[tag.partition(":")[0]]
    return layers.ImageInfo(tag, layer, 1.0, "2026-01-01T00:00:00+00:00", current, in_use, parent)


def test_prune_plan_goes_children_first_and_keeps_what_is_used() -> None:
    listing = [
        _info("trajflow-base:old"),
        _info("trajflow-base:new", current=True),
        _info("trajflow-runtime:old", parent="trajflow-base:old"),
        _info("trajflow-runtime:used-old", parent="trajflow-base:new"),
        _info("trajflow-runtime:new", current=True, parent="trajflow-base:new"),
        _info("trajflow-task:a-old", parent="trajflow-runtime:old"),
        _info("trajflow-task:b-used", in_use=True, parent="trajflow-runtime:used-old"),
        _info("trajflow-task:a-new", current=True, parent="trajflow-runtime:new"),
    ]
    plan = layers.plan_prune(list(reversed(listing)))
    assert [(s.tag, s.remove) for s in plan] == [
        ("trajflow-task:a-old", True),
        ("trajflow-task:b-used", False),
        ("trajflow-runtime:old", True),
        ("trajflow-runtime:used-old", False),  # a kept task layer is built on it
        ("trajflow-base:old", True),
    ]
    assert plan[1].reason == "a container uses it"
    assert plan[3].reason == "trajflow-task:b-used is built on it"


def test_a_kept_layer_keeps_its_whole_stale_ancestry() -> None:
    listing = [
        _info("trajflow-base:old"),
        _info("trajflow-runtime:old", parent="trajflow-base:old"),
        _info("trajflow-task:x-old", in_use=True, parent="trajflow-runtime:old"),
    ]
    assert not any(step.remove for step in layers.plan_prune(listing))


def _write_wheel_cache(cache_dir: Path) -> None:
    target = images.wheel_dir(cache_dir)
    target.mkdir(parents=True)
    (target / "manifest.json").write_text('{"pip-26.3-py3-none-any.whl": "00"}')


def test_current_tags_need_the_wheel_cache_for_runtime_and_tasks(tmp_path: Path) -> None:
    assert layers.current_tags(tmp_path) == {images.base_image_tag()}
    _write_wheel_cache(tmp_path)
    tags = layers.current_tags(tmp_path)
    wheels = {"pip-26.3-py3-none-any.whl": "00"}
    runtime = images.runtime_image_tag(images.base_image_tag(), wheels, images.runtime_sources())
    assert runtime in tags and images.base_image_tag() in tags
    tasks = {t for t in tags if t.startswith("trajflow-task:")}
    assert tasks == {images.task_image_tag(runtime, n, images.task_files(n)) for n in images.shell_task_names()}


def test_build_all_checks_task_names_before_building(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(layers, "ensure_base_image", lambda *a: calls.append("base") or images.base_image_tag())
    monkeypatch.setattr(layers, "ensure_runtime_image", lambda *a: calls.append("runtime") or "trajflow-runtime:r")
    monkeypatch.setattr(layers, "ensure_task_image", lambda _c, _d, name, _p: f"trajflow-task:{name}-t")
    monkeypatch.setattr(layers, "image_exists", lambda _c, tag: tag == images.base_image_tag())
    with pytest.raises(images.UnknownTask):
        layers.build_all(_docker(object()), tmp_path, ["slugify", "no-such-task"])
    assert calls == []
    built = layers.build_all(_docker(object()), tmp_path, ["slugify"])
    assert list(built) == ["base", "runtime", "task:slugify"]
    assert built["base"].cached and not built["runtime"].cached and not built["task:slugify"].cached
    assert built["task:slugify"].tag == "trajflow-task:slugify-t"
    every = layers.build_all(_docker(object()), tmp_path)
    assert set(every) == {"base", "runtime", *(f"task:{n}" for n in images.shell_task_names())}


def _docker(fake: object) -> docker.DockerClient:
    """A stand-in for a Docker client: a fake with only the calls the code under test makes (or nothing, where
    every Docker step is monkeypatched)."""
    return cast(docker.DockerClient, fake)


class FakeEngine:
    """The Docker calls of `list_images` and `prune_images` (`client.api.containers`, `client.api.images`,
    `client.images.remove`) over an in-memory table of tag -> image id."""

    def __init__(
        self,
        tags: dict[str, str],
        used: set[str],
        refuse: frozenset[str] = frozenset(),
        bases: dict[str, str] | None = None,
    ) -> None:
        self.tags = dict(tags)
        self.bases = bases or {}
        """image id -> its `trajflow.base` label"""
        self.used = used
        self.refuse = refuse
        self.removed: list[str] = []
        self.api = SimpleNamespace(containers=self._containers, images=self._images)
        self.images = SimpleNamespace(remove=self._remove)

    def _containers(self, all: bool) -> list[dict[str, str]]:
        return [{"ImageID": image_id} for image_id in sorted(self.used)]

    def _images(self, name: str) -> list[dict[str, object]]:
        ids = {image_id for tag, image_id in self.tags.items() if tag.startswith(f"{name}:")}
        names = {i: [tag for tag, j in self.tags.items() if j == i] for i in sorted(ids)}
        labels = {i: {"trajflow.base": self.bases[i]} if i in self.bases else None for i in ids}
        return [{"Id": i, "RepoTags": n, "Size": 5e6, "Created": 0, "Labels": labels[i]} for i, n in names.items()]

    def _remove(self, tag: str) -> None:
        if tag in self.refuse:
            response = requests.Response()
            response.status_code, response.reason = 409, "Conflict"
            raise docker.errors.APIError("conflict", response=response, explanation="in use by a new container")
        self.removed.append(tag)
        del self.tags[tag]


def _engine(tmp_path: Path, refuse: frozenset[str] = frozenset()) -> FakeEngine:
    _write_wheel_cache(tmp_path)
    current = layers.current_tags(tmp_path)
    tags = {t: f"sha256:{i}" for i, t in enumerate(sorted(current))}
    tags |= {"trajflow-runtime:old": "sha256:ro", "trajflow-task:x-old": "sha256:to"}
    tags |= {"trajflow-task:y-old": "sha256:tu"}
    tags |= {"trajflow-reward:old": "sha256:rw", "other:1": "sha256:o", "other:x-old": "sha256:to"}  # a second name
    return FakeEngine(tags, used={"sha256:tu"}, refuse=refuse)


def test_list_marks_current_and_used_layers_and_ignores_other_repos(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    listing = layers.list_images(_docker(engine), tmp_path)
    assert [i.layer for i in listing] == sorted((i.layer for i in listing), key=layers.LAYERS.index)
    assert {i.tag for i in listing if not i.current} == {
        "trajflow-runtime:old",
        "trajflow-task:x-old",
        "trajflow-task:y-old",
    }
    assert len(listing) == len(layers.current_tags(tmp_path)) + 3
    assert [i.tag for i in listing if i.in_use] == ["trajflow-task:y-old"]
    assert all(i.size_mb == 5.0 and i.created == "1970-01-01T00:00:00+00:00" for i in listing)


def test_prune_removes_stale_layers_children_first_and_keeps_used_ones(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    said: list[str] = []
    assert layers.prune_images(_docker(engine), tmp_path, dry_run=True, progress=said.append) == [
        "trajflow-task:x-old",
        "trajflow-runtime:old",
    ]
    assert engine.removed == [] and "kept trajflow-task:y-old: a container uses it" in said
    assert layers.prune_images(_docker(engine), tmp_path) == ["trajflow-task:x-old", "trajflow-runtime:old"]
    assert engine.removed == ["trajflow-task:x-old", "trajflow-runtime:old"]
    assert "trajflow-reward:old" in engine.tags and "other:1" in engine.tags


def test_prune_only_named_tags_and_docker_refusals_keep_layers(tmp_path: Path) -> None:
    engine = _engine(tmp_path, refuse=frozenset({"trajflow-task:x-old"}))
    said: list[str] = []
    only = ["trajflow-task:x-old", "other:1"]
    assert layers.prune_images(_docker(engine), tmp_path, progress=said.append, only=only) == []
    assert said == ["left other:1: not a stale trajflow layer", "kept trajflow-task:x-old: in use by a new container"]


def test_prune_without_wheel_cache_leaves_runtime_and_task_layers(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    empty = tmp_path / "elsewhere"
    said: list[str] = []
    assert layers.prune_images(_docker(engine), empty, progress=said.append) == []
    assert "no runtime or task layer is pruned" in said[0]


def test_user_env_layers_are_current_while_their_runtime_is_and_go_before_it(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    runtime = next(t for t in layers.current_tags(tmp_path) if t.startswith("trajflow-runtime:"))
    engine.tags |= {"trajflow-userenv:on-new": "sha256:un", "trajflow-userenv:on-old": "sha256:uo"}
    engine.bases = {"sha256:un": runtime, "sha256:uo": "trajflow-runtime:old"}
    listing = {i.tag: i for i in layers.list_images(_docker(engine), tmp_path)}
    assert listing["trajflow-userenv:on-new"].current and not listing["trajflow-userenv:on-old"].current
    assert listing["trajflow-userenv:on-new"].layer == "userenv"
    removed = layers.prune_images(_docker(engine), tmp_path)
    assert removed.index("trajflow-userenv:on-old") < removed.index("trajflow-runtime:old")
    assert "trajflow-userenv:on-new" in engine.tags
