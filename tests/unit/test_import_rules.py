"""Every package obeys its import rule (DESIGN.md "Layout"): parsed with ast, so nothing is imported to check."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STDLIB = set(sys.stdlib_module_names) | {"__future__"}

# package -> (allowed top-level modules besides the stdlib, or None for "anything"), forbidden ones
RULES: dict[str, tuple[set[str] | None, set[str]]] = {
    "contracts": ({"pydantic", "contracts"}, set()),
    "workflows": ({"temporalio", "contracts", "workflows"}, {"torch", "docker", "boto3", "activities", "transformers"}),
    "rl": (None, {"temporalio", "docker", "boto3"}),
    "sandbox": (None, {"torch", "temporalio", "transformers"}),
    # `shell` is envs/shell.py as the runner imports it inside the sandbox image (a sibling file, no package)
    "envs": ({"envs", "gem", "shell"}, set()),
    "rewards": (None, {"torch", "docker", "temporalio", "transformers"}),
    "activities": (None, set()),
    "infra": (None, {"workflows", "activities"}),
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    mods: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods.add(node.module.split(".")[0])
    return mods


def violations(package: str) -> list[str]:
    allowed, forbidden = RULES[package]
    out = []
    # shell tasks' repositories are task data (the projects an agent fixes), not trajflow code
    files = sorted(f for f in (ROOT / package).rglob("*.py") if "shell_tasks" not in f.parts)
    assert files, f"package {package} has no python files"
    for f in files:
        for mod in imported_modules(f):
            if mod in forbidden or (allowed is not None and mod not in allowed and mod not in STDLIB):
                out.append(f"{f.relative_to(ROOT)} imports {mod}")
    return out


@pytest.mark.parametrize("package", sorted(RULES))
def test_package_obeys_its_import_rule(package: str) -> None:
    assert violations(package) == []


def test_the_checker_catches_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "mod.py"
    bad.write_text("import torch\nfrom docker import errors\nfrom . import sibling\n")
    assert imported_modules(bad) == {"torch", "docker"}


def test_cli_imports_nothing_heavy() -> None:
    heavy = {"torch", "transformers", "docker", "temporalio", "boto3", "rl", "sandbox"}
    for path in sorted((ROOT / "trajflow" / "cli").glob("*.py")):
        assert imported_modules(path) & heavy == set(), path
