"""Every package obeys its import rule (DESIGN.md "Layout"): parsed with ast, so nothing is imported to check.

The install's import names are exactly `trajflow` and the design card's four folders, and every package among them
and directly under `trajflow/` has a rule (a new package without one fails here). The core packages never import the
lab (benchmarks, the chaos harness), replay, the command implementations, the CLI or the public face; the CLI imports
those only inside its commands, and the public client never.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STDLIB = set(sys.stdlib_module_names) | {"__future__"}

NOT_CORE = {"trajflow.lab", "trajflow.cli", "trajflow.client", "trajflow.__main__", "trajflow"}
"""Beside the core: the lab (benchmarks, chaos), the CLI with its commands and replay, the client and the public
face (`from trajflow import ...`)."""

UPPER = {"trajflow.infra", "trajflow.activities", "trajflow.workers", "trajflow.workflows"} | NOT_CORE
"""What the lower layers (rl, sandbox, envs, rewards, observability) never import, not even inside a function:
infra, the Temporal side and everything beside the core. What they need of a store or an engine is a contract."""

# package (dotted) -> (allowed modules besides the stdlib, or None for "anything"), forbidden ones. A file belongs to
# the longest package that holds it; an entry covers that module and everything under it (`trajflow` alone means
# the public face only: every package lives under it).
RULES: dict[str, tuple[set[str] | None, set[str]]] = {
    "trajflow.contracts": ({"pydantic", "trajflow.contracts"}, set()),
    # workflows record their metrics and spans through trajflow.observability (the SDK's replay-safe meter)
    "trajflow.workflows": (
        {
            "temporalio",
            "trajflow.contracts",
            "trajflow.workflows",
            "trajflow.observability.metrics",
            "trajflow.observability.spans",
        },
        {"torch", "docker", "boto3", "trajflow.activities", "transformers"},
    ),
    "trajflow.rl": (None, {"temporalio", "docker", "boto3"} | UPPER),
    "trajflow.sandbox": (None, {"torch", "temporalio", "transformers"} | UPPER),
    # image building: content-hashed docker builds from files and wheels, nothing else of the project
    "trajflow.sandbox.builder": ({"docker", "trajflow.sandbox.builder", "packaging"}, set()),
    # `gem_loader`, `shell`, `gym_adapter`, `gym_text`, `dataset`, `verify` and the agent env's modules (`agent`,
    # `agent_http`, `agent_chat`, `agent_messages`, `agent_process`, `agent_responses`,
    # `agent_verify`) are trajflow.envs modules as the
    # runner imports them inside the sandbox image (sibling files, no package); gymnasium only for `gym:` envs;
    # pyarrow and math_verify are in the runtime layer (imported lazily)
    "trajflow.envs": (
        {
            "trajflow.envs",
            "gem",
            "gymnasium",
            "gem_loader",
            "agent",
            "agent_http",
            "agent_chat",
            "agent_messages",
            "agent_process",
            "agent_responses",
            "agent_verify",
            "shell",
            "gym_adapter",
            "gym_text",
            "dataset",
            "verify",
            "pyarrow",
            "math_verify",
            # the env id prefixes: `trajflow.contracts.env_ids` on the host, `env_ids` beside the runner in the image
            "trajflow.contracts.env_ids",
            "env_ids",
        },
        set(),
    ),
    # user envs are read with ast and packed with the stdlib: nothing of the sandbox, the workers or Temporal
    # (a dataset's rows are read by the dataset env's own reader, trajflow.envs.dataset)
    "trajflow.sandbox.user": (
        {"trajflow.sandbox.user", "trajflow.envs", "trajflow.contracts", "trajflow.sandbox.builder", "packaging"},
        set(),
    ),
    "trajflow.rewards": (None, {"torch", "docker", "temporalio", "transformers", "trajflow.rewards.models"} | UPPER),
    # local reward models: torch and a web server; nothing of Temporal, Docker or the reward service
    "trajflow.rewards.models": (
        {
            "trajflow.rewards.models",
            "trajflow.contracts",
            "trajflow.rl",
            "torch",
            "transformers",
            "fastapi",
            "uvicorn",
            "pydantic",
        },
        set(),
    ),
    # metrics through the Temporal SDK's runtime, Prometheus's config and HTTP API, spans through OpenTelemetry:
    # nothing of the stack's own
    "trajflow.observability": (
        {"temporalio", "trajflow.contracts", "trajflow.observability", "httpx", "opentelemetry"},
        set(),
    ),
    # the CLI's training run logs through it; each backend's package is imported only by its own module
    "trajflow.observability.tracking": (
        {"trajflow.contracts", "trajflow.observability.tracking", "tensorboardX", "wandb", "mlflow"},
        set(),
    ),
    "trajflow.activities": (None, NOT_CORE),
    # infra never imports torch, not even inside a function (DESIGN.md "Layout"), nor the layers below it that
    # build images and run models (what it shares with them is a contract)
    "trajflow.infra": (
        None,
        {"trajflow.workflows", "trajflow.activities", "trajflow.sandbox", "trajflow.rl", "trajflow.envs"}
        | {"torch", "transformers", "accelerate", "vllm"}
        | NOT_CORE,
    ),
    "trajflow.workers": (None, NOT_CORE),
    "trajflow.lab": (set(), set()),
    "trajflow.lab.bench": (None, {"trajflow.lab.chaos", "trajflow.cli"}),
    "trajflow.lab.chaos": (None, {"trajflow.lab.bench", "trajflow.cli"}),
    "trajflow.lab.analysis": (None, {"trajflow.lab.bench", "trajflow.lab.chaos", "trajflow.cli"}),
    "trajflow.cli.replay": (None, {"trajflow.lab", "trajflow.cli.commands"}),
    "trajflow.cli.commands": (None, {"trajflow.lab"}),
    # the CLI dispatches to the lab, replay and the commands inside its commands: see the tests below
    "trajflow.cli": (None, set()),
    # the public face and the client: see the tests below
    "trajflow": (None, {"trajflow.lab", "trajflow.cli.commands", "trajflow.cli.replay"}),
}

TORCH_FREE_RL = {"trajflow.rl", "trajflow.rl.engines", "trajflow.rl.engines.base", "trajflow.rl.advantages"}
"""The rl modules that import no torch (nor anything that does): all that infra may import from rl."""

CARD_FOLDERS = ("workflows", "activities", "workers", "infra")
"""The design card's folders at the repository's root: each is linked from `trajflow/` and installs under it
(`trajflow.workflows`, ...), so `trajflow` is the only import name an install adds."""


def covers(entry: str, name: str) -> bool:
    """`entry` covers module `name`: the same module or one under it (`trajflow` alone covers only itself)."""
    return name == entry or (entry != "trajflow" and name.startswith(entry + "."))


def module_name(path: Path) -> str:
    """The dotted name `path` installs as: the card's folders at the root are `trajflow.<folder>`."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("trajflow", *parts) if parts[0] in CARD_FOLDERS else parts)


def package_of(path: Path) -> str:
    """The longest package of RULES that holds `path`."""
    dotted = module_name(path)
    return max((p for p in RULES if covers(p, dotted) or (p == "trajflow" and top(dotted) == p)), key=len)


def project_packages() -> set[str]:
    """`trajflow` and every package one level under it (the card's folders through their links)."""
    return {"trajflow"} | {f"trajflow.{p.parent.name}" for p in (ROOT / "trajflow").glob("*/__init__.py")}


def imported_modules(path: Path, module_level_only: bool = False) -> set[str]:
    """Full dotted names of the modules `path` imports (absolute imports; relative ones stay inside a package):
    `from P import X` names `P.X` where that is a module or package of the tree, else `P`. With `module_level_only`,
    only the imports that run when the module is imported (not inside functions)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = module_level_nodes(tree) if module_level_only else ast.walk(tree)
    mods: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            mods |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                mods.add(sub if is_project_module(sub) else node.module)
    return mods


def is_project_module(dotted: str) -> bool:
    base = ROOT.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def top(name: str) -> str:
    return name.split(".")[0]


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
    files = sorted(
        f
        for f in ROOT.joinpath(*package.split(".")).rglob("*.py")
        if "shell_tasks" not in f.parts and package_of(f) == package
    )
    assert files, f"package {package} has no python files"
    for f in files:
        for mod in imported_modules(f):
            bad = any(covers(e, mod) for e in forbidden)
            ok = allowed is None or top(mod) in STDLIB or any(covers(e, mod) for e in allowed)
            if bad or not ok:
                out.append(f"{f.relative_to(ROOT)} imports {mod}")
    return out


@pytest.mark.parametrize("package", sorted(RULES))
def test_package_obeys_its_import_rule(package: str) -> None:
    assert violations(package) == []


def test_every_package_has_a_rule() -> None:
    assert {f"trajflow.{folder}" for folder in CARD_FOLDERS} <= project_packages() <= set(RULES)


def test_the_root_holds_trajflow_and_the_card_folders_each_linked_under_trajflow() -> None:
    assert {p.parent.name for p in ROOT.glob("*/__init__.py")} == {"trajflow", *CARD_FOLDERS}
    for folder in CARD_FOLDERS:
        link = ROOT / "trajflow" / folder
        assert link.is_symlink() and link.resolve() == ROOT / folder, link


def python_sources() -> list[Path]:
    """Every tracked Python file (product, tests, scripts, examples), the card's folders once, at the root."""
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / name for name in listed.stdout.split() if not (ROOT / name).is_symlink()]


def test_nothing_imports_a_card_folder_by_its_bare_name() -> None:
    """`import workflows` would find a project's own `workflows.py` first; every import goes through `trajflow`
    (function bodies included)."""
    bad = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in python_sources()
        if "shell_tasks" not in path.parts
        for name in imported_names(path)
        if top(name) in CARD_FOLDERS
    ]
    assert bad == []


def test_the_bare_name_check_catches_a_lazy_import(tmp_path: Path) -> None:
    mod = tmp_path / "mod.py"
    mod.write_text("def f():\n    from infra.settings import load_settings\n")
    assert {top(name) for name in imported_names(mod)} & set(CARD_FOLDERS) == {"infra"}


def test_a_file_belongs_to_its_longest_package() -> None:
    assert package_of(ROOT / "trajflow" / "rewards" / "models" / "server.py") == "trajflow.rewards.models"
    assert package_of(ROOT / "trajflow" / "rewards" / "service.py") == "trajflow.rewards"
    assert package_of(ROOT / "trajflow" / "client.py") == "trajflow"
    assert package_of(ROOT / "workflows" / "training.py") == "trajflow.workflows"
    assert package_of(ROOT / "trajflow" / "workflows" / "training.py") == "trajflow.workflows"
    assert covers("trajflow.rl", "trajflow.rl.engines.hf") and not covers("trajflow.rl", "trajflow.rewards")
    assert not covers("trajflow", "trajflow.rl") and covers("trajflow", "trajflow")


def test_the_checker_catches_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "mod.py"
    bad.write_text("import torch\nfrom docker import errors\nfrom . import sibling\n")
    assert imported_modules(bad) == {"torch", "docker"}
    assert imported_modules(bad) & {"trajflow.lab"} == set()
    mod = tmp_path / "mod2.py"
    mod.write_text("from trajflow import contracts\nfrom trajflow.contracts import names\nfrom trajflow import x\n")
    assert imported_modules(mod) == {"trajflow.contracts", "trajflow.contracts.names", "trajflow"}


def test_module_level_excludes_function_bodies(tmp_path: Path) -> None:
    mod = tmp_path / "mod.py"
    mod.write_text("import json\nwith x:\n    import docker\ndef f():\n    import torch\nclass C:\n    import boto3\n")
    assert imported_modules(mod, module_level_only=True) == {"json", "docker"}
    assert imported_modules(mod) == {"json", "docker", "torch", "boto3"}


def test_cli_imports_nothing_heavy() -> None:
    heavy = {"torch", "transformers", "docker", "temporalio", "boto3", "trajflow.rl", "trajflow.sandbox"}
    light = {"trajflow.sandbox.user"}  # a user's env packed on the host: ast and the stdlib, no Docker
    deferred = {"trajflow.lab", "trajflow.cli.commands", "trajflow.cli.replay", "trajflow.workers", "trajflow.infra"}
    for path in sorted((ROOT / "trajflow" / "cli").glob("*.py")):
        mods = imported_modules(path)
        assert not [m for m in mods if any(covers(h, m) for h in heavy) and not any(covers(x, m) for x in light)], path
        # what a command runs is imported inside that command, so --help loads none of it
        at_load = imported_modules(path, module_level_only=True)
        assert not [m for m in at_load if any(covers(d, m) for d in deferred)], path


def test_the_client_is_a_library() -> None:
    mods = imported_modules(ROOT / "trajflow" / "client.py")
    assert not [m for m in mods if any(covers(e, m) for e in NOT_CORE - {"trajflow.client"})]


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
        if covers("trajflow.rl", name) and name not in TORCH_FREE_RL
    ]
    assert bad == []


@pytest.mark.parametrize("module", sorted(TORCH_FREE_RL - {"trajflow.rl", "trajflow.rl.engines"}))
def test_torch_free_rl_modules_import_only_stdlib_contracts_and_each_other(module: str) -> None:
    path = ROOT / (module.replace(".", "/") + ".py")
    for name in imported_names(path):
        assert top(name) in STDLIB | {"pydantic"} or covers("trajflow.contracts", name) or name in TORCH_FREE_RL, (
            f"{module} imports {name}"
        )


def test_torch_free_base_and_infra_load_no_torch() -> None:
    """Imported for real in a fresh interpreter: not even a transitive import may pull torch in."""
    modules = sorted(TORCH_FREE_RL) + [
        "trajflow.infra.policies",
        "trajflow.infra.setup",
        "trajflow.infra.settings",
        "trajflow.infra.store",
    ]
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
    bad.write_text("def f():\n    from trajflow.rl.models import resolve_model\n    import torch\n")
    assert imported_names(bad) == {"trajflow.rl.models", "torch"}
    assert "trajflow.rl.models" not in TORCH_FREE_RL


def test_the_env_id_prefixes_import_nothing() -> None:
    """`trajflow/contracts/env_ids.py` runs beside the runner in the sandbox, whose Python has neither pydantic nor
    trajflow: it may import nothing at all."""
    assert imported_names(ROOT / "trajflow" / "contracts" / "env_ids.py") == set()
