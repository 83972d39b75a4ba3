"""The generic image-build pieces of `imagebuild`, without Docker: mirror discovery, stable hashes, the wheel cache
layout and the wheel build stage."""

from __future__ import annotations

from pathlib import Path

from trajflow.sandbox.builder import base, docker_build, wheels


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
    assert (
        "python3 /w/pip-26.3-py3-none-any.whl/pip install --no-index" in text
        and "--target /opt/site 'fastapi==1'" in text
    )


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


def test_the_worker_image_holds_every_package_the_workers_import() -> None:
    """A worker-side module importing a distribution the image lacks fails only inside `trajflow up --hosts`
    containers (as `opentelemetry.sdk` did when the workers began to trace). Each import is resolved to the
    distribution that provides it; a namespace package (`opentelemetry`) to the one holding the part imported."""
    import ast
    import sys
    from importlib.metadata import distribution, packages_distributions

    from trajflow.sandbox.builder.worker_image import SOURCE_PACKAGES, package_dir, worker_requirements

    # envs runs inside the sandboxes (its own image), not in a worker; the lab, the CLI's commands and the trackers
    # run on the user's side
    root = package_dir("trajflow").parent
    worker_side = (
        "trajflow/activities",
        "trajflow/infra",
        "trajflow/workers",
        "trajflow/workflows",
        "trajflow/contracts",
        "trajflow/rewards",
        "trajflow/rl",
        "trajflow/sandbox",
        "trajflow/observability",
    )
    user_side = ("trajflow/observability/tracking",)
    project = set(SOURCE_PACKAGES)
    imported: set[str] = set()
    files = [p for package in worker_side for p in (root / package).rglob("*.py")]
    assert len(files) > 100, "the worker-side packages were not found"
    for path in files:
        if any(path.is_relative_to(root / u) for u in user_side):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module)
    # optional engines and GPU tooling, imported inside functions for the configs that name them
    optional = {"vllm", "openai", "pynvml"}
    skip = set(sys.stdlib_module_names) | project | optional | {"__future__"}
    third_party = {m for m in imported if m.split(".")[0] not in skip}
    in_image = {r.split("==")[0].lower().replace("_", "-") for r in worker_requirements()}
    owners = packages_distributions()

    def provider(module: str) -> str | None:
        top, _, rest = module.partition(".")
        candidates = owners.get(top, [])
        if len(candidates) <= 1:
            return candidates[0].lower().replace("_", "-") if candidates else None
        # a namespace package (`opentelemetry`): the distribution that holds the part imported
        part = rest.split(".")[0]
        for name in candidates:
            files = distribution(name).files or []
            if any(f.parts[:2] == (top, part) or f.parts[:2] == (top, f"{part}.py") for f in files):
                return name.lower().replace("_", "-")
        return None

    missing = {m: provider(m) for m in sorted(third_party) if provider(m) not in in_image}
    assert missing == {}
