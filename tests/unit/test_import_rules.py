"""Every package obeys its import rule (DESIGN.md "Layout"): parsed with ast, so nothing is imported to check."""

from __future__ import annotations

import ast
import subprocess
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
    # infra never imports torch, not even inside a function (DESIGN.md "Layout"); rl only through TORCH_FREE_RL
    "infra": (None, {"workflows", "activities", "torch", "transformers", "accelerate", "vllm"}),
}

TORCH_FREE_RL = {"rl", "rl.engines", "rl.engines.base", "rl.advantages"}
"""The rl modules that import no torch (nor anything that does): all that infra may import from rl."""


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
    assert imported_modules(ROOT / "trajflow" / "cli.py") & heavy == set()


def imported_names(path: Path) -> set[str]:
    """Full dotted names of absolute imports anywhere in the file (function bodies included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_infra_imports_only_torch_free_rl_modules() -> None:
    bad = [
        f"{f.relative_to(ROOT)} imports {name}"
        for f in sorted((ROOT / "infra").rglob("*.py"))
        for name in imported_names(f)
        if name.split(".")[0] == "rl" and name not in TORCH_FREE_RL
    ]
    assert bad == []


@pytest.mark.parametrize("module", sorted(TORCH_FREE_RL - {"rl", "rl.engines"}))
def test_torch_free_rl_modules_import_only_stdlib_contracts_and_each_other(module: str) -> None:
    path = ROOT / (module.replace(".", "/") + ".py")
    for name in imported_names(path):
        top = name.split(".")[0]
        assert top in STDLIB | {"contracts", "pydantic"} or name in TORCH_FREE_RL, f"{module} imports {name}"


def test_torch_free_base_and_infra_load_no_torch() -> None:
    """Imported for real in a fresh interpreter: not even a transitive import may pull torch in."""
    modules = sorted(TORCH_FREE_RL) + ["infra.policies", "infra.setup", "infra.settings", "infra.store"]
    code = (
        "import sys\n"
        f"for m in {modules!r}: __import__(m)\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'accelerate', 'vllm') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_the_infra_rule_catches_a_torch_using_rl_module(tmp_path: Path) -> None:
    bad = tmp_path / "mod.py"
    bad.write_text("def f():\n    from rl.models import resolve_model\n    import torch\n")
    assert imported_names(bad) == {"rl.models", "torch"}
    assert "rl.models" not in TORCH_FREE_RL
