"""The shape of the tree: no module over ~400 lines (STYLE.md: grow a package by adding a file); the Layout table of
docs/architecture.md lists exactly the top-level packages and its import-rule table exactly the packages with a rule;
the README stays a front page. Counted: every .py file outside tests/ and outside trajflow/envs/shell_tasks/ (task
data: the repositories an agent fixes)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 400
ARCHITECTURE = ROOT / "docs" / "architecture.md"
README_MAX_LINES = 250


def project_files() -> list[Path]:
    return sorted(
        p
        for p in ROOT.rglob("*.py")
        if not {"tests", "shell_tasks"} & set(p.relative_to(ROOT).parts)
        and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
    )


def test_the_tree_is_formatted() -> None:
    """`ruff format --check`: the sizes below are of formatted modules, and a module cannot stay under the limit by
    packing its lines (pyproject's line length, 120)."""
    ruff = Path(sys.executable).parent / "ruff"
    done = subprocess.run(
        [str(ruff if ruff.exists() else "ruff"), "format", "--check", str(ROOT)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_module_is_over_the_limit() -> None:
    files = project_files()
    assert len(files) > 50
    over = {p.relative_to(ROOT).as_posix(): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert over == {}


LAB_SHARE_MAX = 0.12
"""The lab (benchmarks, chaos, analyses) is at most this share of the product's lines: a finished study keeps its
results in docs/results and its code in git history, not in the tree."""


def test_the_lab_stays_a_small_share_of_the_code() -> None:
    lines = {p: len(p.read_text().splitlines()) for p in project_files()}
    lab = sum(n for p, n in lines.items() if p.is_relative_to(ROOT / "trajflow" / "lab"))
    assert lab > 0 and lab / sum(lines.values()) < LAB_SHARE_MAX, f"the lab is {lab / sum(lines.values()):.1%}"


def test_no_module_escapes_the_formatter() -> None:
    """A module stays under the limit by splitting at its seams, not by packing lines the formatter would spread."""
    escapes = [
        f"{p.relative_to(ROOT).as_posix()}:{i + 1}"
        for p in project_files()
        for i, line in enumerate(p.read_text().splitlines())
        if line.rstrip().endswith(("# fmt: skip", "# fmt: off"))
    ]
    assert escapes == []


def section(text: str, heading: str) -> str:
    """The text under `## heading`, up to the next `## ` heading."""
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def table_packages(text: str) -> list[str]:
    """The package paths (`trajflow/rl`, `workers`) in the first column of a Markdown table."""
    return re.findall(r"^\| `([A-Za-z_][A-Za-z0-9_/]*)/` \|", text, flags=re.M)


def packages(depth: int) -> set[str]:
    """The packages at the root and under trajflow/, down to `depth` levels below trajflow/ (shell tasks excluded)."""
    found = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    for level in range(1, depth + 1):
        pattern = "/".join(["*"] * level) + "/__init__.py"
        found |= {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "trajflow").glob(pattern)}
    # trajflow/workflows and the other card folders are links to the root's folders, listed under their own names
    return {p for p in found if "shell_tasks" not in p and not (ROOT / "/".join(p.split("/")[:2])).is_symlink()}


def test_the_architecture_layout_table_matches_the_tree() -> None:
    """Every package at the root and directly under trajflow/ is listed; deeper ones may be; none that is not one."""
    listed = table_packages(section(ARCHITECTURE.read_text(), "Layout"))
    assert len(listed) == len(set(listed)), listed
    assert packages(1) <= set(listed), packages(1) - set(listed)
    assert set(listed) <= packages(3), set(listed) - packages(3)


def test_the_architecture_import_rule_table_lists_every_rule() -> None:
    """The table under "Packages and their import rules" has one row per package of test_import_rules.RULES."""
    from tests.unit.test_import_rules import RULES

    listed = table_packages(section(ARCHITECTURE.read_text(), "Packages and their import rules"))
    dotted = [p.replace("/", ".") for p in listed]
    assert len(dotted) == len(set(dotted)), dotted
    assert set(dotted) == set(RULES), {"missing": set(RULES) - set(dotted), "extra": set(dotted) - set(RULES)}


def test_the_readme_is_a_front_page() -> None:
    """STYLE.md: the README is what it is, a picture, the two commands, short examples and links; guides live in
    docs/."""
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move guide material to docs/"


def test_every_package_says_its_job() -> None:
    for init in [*ROOT.glob("*/__init__.py"), *(ROOT / "trajflow").glob("*/__init__.py")]:
        doc = init.read_text().strip()
        assert doc.startswith('"""') and len(doc) > 20, f"{init.relative_to(ROOT)} has no one-line job"


def test_every_test_module_has_its_own_name() -> None:
    """tests/unit and tests/integration are not packages: pytest imports each test module by its file name, so two
    of the same name (one in each folder) fail the whole run at collection ("import file mismatch")."""
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}


def test_no_file_holds_merge_conflict_markers() -> None:
    """A merge committed half-resolved (as once happened to scripts/bootstrap.sh) breaks what only CI runs."""
    suffixes = {".py", ".sh", ".md", ".toml", ".yml", ".yaml", ".cfg", ".txt", ".json", ""}
    marked = []
    for p in ROOT.rglob("*"):
        rel = p.relative_to(ROOT)
        if any(part.startswith(".") for part in rel.parts[:-1]) or not p.is_file() or p.suffix not in suffixes:
            continue
        if p.stat().st_size > 2_000_000:
            continue
        try:
            lines = p.read_text().splitlines()
        except UnicodeDecodeError:
            continue
        marked += [f"{rel}:{i + 1}" for i, line in enumerate(lines) if line.startswith(("<<<<<<< ", ">>>>>>> "))]
    assert marked == []


def test_the_worker_image_copies_every_package() -> None:
    """A package missing from the worker image's sources fails only inside `trajflow up --hosts` containers (as
    `telemetry`, imported by the workflows, would have)."""
    from trajflow.sandbox.builder.worker_image import SOURCE_PACKAGES, source_files

    assert SOURCE_PACKAGES == ("trajflow",)
    copied = source_files()
    for init in sorted(ROOT.glob("*/__init__.py")):
        package = init.parent.name
        name = "trajflow/__init__.py" if package == "trajflow" else f"trajflow/{package}/__init__.py"
        assert name in copied, f"{package} is not in the worker image's sources"
    assert "trajflow/workflows/training.py" in copied and "trajflow/infra/compose/hosts.yml" in copied
