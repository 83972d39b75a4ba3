"""Every package obeys its import rule (DESIGN.md "Layout"): parsed with ast, so nothing is imported to check.

Every top-level package has a rule (a new package without one fails here). The core packages never import the
benchmarks, the chaos harness, replay, the command implementations or the CLI; the CLI imports those only
inside its commands, and the public client never.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STDLIB = set(sys.stdlib_module_names) | {"__future__"}

NOT_CORE = {"bench", "chaos", "replay", "commands", "trajflow"}
"""Beside the core: benchmarks, chaos, replay, the command implementations and the CLI + client."""

# package -> (allowed top-level modules besides the stdlib, or None for "anything"), forbidden ones
RULES: dict[str, tuple[set[str] | None, set[str]]] = {
    "contracts": ({"pydantic", "contracts"}, set()),
    # workflows record their metrics through telemetry.metrics (the SDK's replay-safe meter)
    "workflows": (
        {"temporalio", "contracts", "workflows", "telemetry"},
        {"torch", "docker", "boto3", "activities", "transformers"},
    ),
    "rl": (None, {"temporalio", "docker", "boto3"} | NOT_CORE),
    "sandbox": (None, {"torch", "temporalio", "transformers"} | NOT_CORE),
    # `shell`, `gym_adapter`, `gym_text`, `dataset` and `verify` are envs/ modules as the runner imports them inside
    # the sandbox image (sibling files, no package); gymnasium only for `gym:` envs; pyarrow and math_verify are in
    # the runtime layer (imported lazily)
    "envs": (
        {"envs", "gem", "gymnasium", "shell", "gym_adapter", "gym_text", "dataset", "verify", "pyarrow", "math_verify"},
        set(),
    ),
    "rewards": (None, {"torch", "docker", "temporalio", "transformers"} | NOT_CORE),
    # local reward models: torch and a web server; nothing of Temporal, Docker or the reward service
    "rewardmodels": (
        {"rewardmodels", "contracts", "rl", "infra", "torch", "transformers", "fastapi", "uvicorn", "pydantic"},
        set(),
    ),
    "activities": (None, NOT_CORE),
    # infra never imports torch, not even inside a function (DESIGN.md "Layout"); rl only through TORCH_FREE_RL
    "infra": (None, {"workflows", "activities", "torch", "transformers", "accelerate", "vllm"} | NOT_CORE),
    "workers": (None, NOT_CORE),
    "imagebuild": ({"docker", "imagebuild", "packaging"}, set()),
    # user envs are read with ast and packed with the stdlib: nothing of the sandbox, the workers or Temporal
    # (a dataset's rows are read by the dataset env's own reader, envs.dataset)
    "userenvs": ({"userenvs", "contracts", "envs", "imagebuild", "infra", "packaging"}, set()),
    # metrics through the Temporal SDK's runtime, Prometheus's config and HTTP API, spans through OpenTelemetry:
    # nothing of the stack's own
    "telemetry": ({"temporalio", "contracts", "telemetry", "httpx", "opentelemetry"}, set()),
    # the CLI's training run logs through it; each backend's package is imported only by its own module
    "tracking": ({"contracts", "tracking", "tensorboardX", "wandb", "mlflow"}, set()),
    "bench": (None, {"chaos", "replay", "commands"}),
    "chaos": (None, {"bench", "replay"}),
    "replay": (None, {"bench", "chaos", "commands"}),
    "commands": (None, {"bench", "chaos"}),
    # the CLI dispatches to bench/chaos/replay/commands inside its commands: see the tests below
    "trajflow": (None, set()),
}

TORCH_FREE_RL = {"rl", "rl.engines", "rl.engines.base", "rl.advantages"}
"""The rl modules that import no torch (nor anything that does): all that infra may import from rl."""


def top_level_packages() -> set[str]:
    """The directories at the repository root that are Python packages (tests/ is not one)."""
    return {p.parent.name for p in ROOT.glob("*/__init__.py")}


def imported_modules(path: Path, module_level_only: bool = False) -> set[str]:
    """Top-level names of the modules `path` imports (absolute imports; relative ones stay inside a package).
    With `module_level_only`, only the imports that run when the module is imported (not inside functions)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = module_level_nodes(tree) if module_level_only else ast.walk(tree)
    mods: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods.add(node.module.split(".")[0])
    return mods


def module_level_nodes(tree: ast.Module) -> list[ast.stmt]:
    """The statements that run on import: the module body and the bodies of its top-level with/try/if blocks,
    not function or class bodies."""
    out: list[ast.stmt] = []
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, (ast.With, ast.If, ast.Try)):
            todo += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            for handler in getattr(node, "handlers", []):
                todo += handler.body
    return out


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


def test_every_package_has_a_rule() -> None:
    assert top_level_packages() == set(RULES)


def test_the_checker_catches_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "mod.py"
    bad.write_text("import torch\nfrom docker import errors\nfrom . import sibling\n")
    assert imported_modules(bad) == {"torch", "docker"}


def test_module_level_excludes_function_bodies(tmp_path: Path) -> None:
    mod = tmp_path / "mod.py"
    mod.write_text("import json\nwith x:\n    import docker\ndef f():\n    import torch\nclass C:\n    import boto3\n")
    assert imported_modules(mod, module_level_only=True) == {"json", "docker"}
    assert imported_modules(mod) == {"json", "docker", "torch", "boto3"}


def test_cli_imports_nothing_heavy() -> None:
    heavy = {"torch", "transformers", "docker", "temporalio", "boto3", "rl", "sandbox"}
    for path in sorted((ROOT / "trajflow" / "cli").glob("*.py")):
        assert imported_modules(path) & heavy == set(), path
        # what a command runs is imported inside that command, so --help loads none of it
        assert imported_modules(path, module_level_only=True) & (NOT_CORE - {"trajflow"} | {"workers", "infra"}) == set(), path


def test_the_client_is_a_library() -> None:
    assert imported_modules(ROOT / "trajflow" / "client.py") & (NOT_CORE - {"trajflow"}) == set()


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
