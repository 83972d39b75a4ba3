"""pyproject.toml's ranges against the lock files the set-up installs (requirements/*.txt, `make lock`): every range
admits the locked version, the three locks agree, each holds what its extras need, the base lock holds no torch,
transformers or Docker SDK, and torch is the local CPU wheel 2.13.0+cpu. Pure: reads files, installs nothing
(tests/integration/test_base_install.py installs the base lock)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ("base", "all", "dev")
EXTRAS_OF_LOCK = {"base": (), "all": ("all",), "dev": ("dev",)}
HEAVY = {"torch", "transformers", "tokenizers", "accelerate", "peft", "gguf", "docker", "moto"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def locked(name: str) -> dict[str, Version]:
    """{canonical name: version} of requirements/NAME.txt; every pin carries at least one hash."""
    text = (ROOT / "requirements" / f"{name}.txt").read_text()
    pins: dict[str, Version] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        head = block.split(" \\", 1)[0].strip()
        if not head or head.startswith("#"):
            continue
        req = Requirement(head)
        assert "--hash=sha256:" in block, f"{head} in {name}.txt has no hash"
        pins[canonicalize_name(req.name)] = Version(str(req.specifier).removeprefix("=="))
    return pins


def requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """The project's requirements with `extras`, self-references (`trajflow[decode]`) followed."""
    project = _pyproject()
    optional = project["optional-dependencies"]
    found = [Requirement(r) for r in project["dependencies"]]
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in optional[extra]:
            req = Requirement(line)
            if canonicalize_name(req.name) == "trajflow":
                todo += sorted(req.extras)
            else:
                found.append(req)
    return found


@pytest.mark.parametrize("lock", LOCKS)
def test_every_range_admits_the_locked_version(lock: str) -> None:
    pins = locked(lock)
    for req in requirements(EXTRAS_OF_LOCK[lock]):
        version = pins.get(canonicalize_name(req.name))
        assert version is not None, f"{req.name} is not in requirements/{lock}.txt: run `make lock`"
        assert req.specifier.contains(version, prereleases=True), f"{req} does not admit the locked {version}"


def test_the_locks_agree_and_nest() -> None:
    base, every, dev = (locked(name) for name in LOCKS)
    assert base.keys() <= every.keys() <= dev.keys()
    for name, version in every.items():
        assert dev[name] == version and base.get(name, version) == version, name


def test_every_range_has_an_upper_bound() -> None:
    project = _pyproject()
    lines = [*project["dependencies"], *(r for rs in project["optional-dependencies"].values() for r in rs)]
    for req in (Requirement(line) for line in lines):
        if canonicalize_name(req.name) != "trajflow":
            assert any(s.operator in ("<", "==") for s in req.specifier), f"{req} has no upper bound"


def test_the_base_lock_is_light_and_torch_is_the_local_cpu_wheel() -> None:
    assert not HEAVY & locked("base").keys()
    for name in ("all", "dev"):
        assert locked(name)["torch"] == Version("2.13.0+cpu")


def test_the_demos_lock_holds_what_the_analysis_imports_on_the_host() -> None:
    """`trajflow analyze guess-the-number` draws targets with GEM on the host; `make demo` installs all.txt."""
    assert "gem-llm" in {canonicalize_name(r.name) for r in requirements(EXTRAS_OF_LOCK["all"])}
    assert "gem-llm" in locked("all")
