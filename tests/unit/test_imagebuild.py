"""The generic image-build pieces of `imagebuild`, without Docker: mirror discovery, stable hashes, the wheel cache
layout and the wheel build stage."""

from __future__ import annotations

from pathlib import Path

from imagebuild import base, docker_build, wheels


def test_digest_is_stable_and_order_free() -> None:
    assert docker_build.digest({"a": 1, "b": [1, 2]}) == docker_build.digest({"b": [1, 2], "a": 1})
    assert len(docker_build.digest({})) == 16


def test_base_tag_is_stable_and_named() -> None:
    assert base.base_image_tag() == base.base_image_tag()
    assert base.base_image_tag().startswith("trajflow-base:")


def test_wheel_sets_have_their_own_directories(tmp_path: Path) -> None:
    one, two = wheels.wheel_dir(tmp_path, ("a==1",)), wheels.wheel_dir(tmp_path, ("a==2",))
    assert one != two and one.parent == two.parent == tmp_path / "wheels"
    assert wheels.cached_wheels(tmp_path, ("a==1",)) is None


def test_build_stage_installs_with_pip_from_its_wheel() -> None:
    text = wheels.wheel_build_stage("trajflow-base:x", ["pip-26.3-py3-none-any.whl"], ("fastapi==1",), "/opt/site")
    assert text.startswith("FROM trajflow-base:x AS build")
    assert "python3 /w/pip-26.3-py3-none-any.whl/pip install --no-index" in text and "--target /opt/site 'fastapi==1'" in text


def test_mirror_from_deb822(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# a comment\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\n"
        "Components: main\n\nTypes: deb\nURIs: http://security.example/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n"
    )
    assert base.debian_mirror(tmp_path) == "http://mirror.example/debian"


def test_mirror_from_sources_list(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text(
        "# deb http://commented.example/debian bookworm main\n"
        "deb http://security.example/debian-security bookworm-security main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://list.example/debian bookworm main\n"
    )
    assert base.debian_mirror(tmp_path) == "http://list.example/debian"


def test_mirror_default(tmp_path: Path) -> None:
    assert base.debian_mirror(tmp_path) == base.DEFAULT_MIRROR
