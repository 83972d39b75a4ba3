"""No import loops between trajflow's modules: parsed with ast, nothing is imported to check.

The graph has an edge A -> B when module A imports module B *at module level*: the module body and the bodies of
its top-level `with`/`try`/`if` blocks (so `with workflow.unsafe.imports_passed_through():` counts), except
`if TYPE_CHECKING:` blocks, which never run. Function-level imports do NOT count: they run after every module is
loaded (that is how the CLI and the workers defer heavy imports), so they cannot deadlock an import. `from P
import X` is an edge to `P.X` when that is a module, else to `P`; a package's own `__init__` is not implied by
importing one of its modules (none of them imports its submodules back). Covered: every package at the root
(tests/ and the shell tasks' repositories, which are task data, excluded).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every package at `root`."""
    mods: dict[str, Path] = {}
    for init in root.glob("*/__init__.py"):
        for path in init.parent.rglob("*.py"):
            if "shell_tasks" in path.parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    out: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif isinstance(node, ast.If):
            todo += node.orelse if _is_type_checking(node) else [*node.body, *node.orelse]
        elif isinstance(node, (ast.With, ast.Try)):
            todo += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            for handler in getattr(node, "handlers", []):
                todo += handler.body
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in module_level_imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            graph[name] |= {t for t in targets if t in mods and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_between_modules() -> None:
    mods = project_modules()
    assert len(mods) > 50
    assert cycles(import_graph(mods)) == []


def test_the_checker_finds_a_cycle(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import x\n")
    (tmp_path / "pkg" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.d\nfrom . import c\n"
    )
    (tmp_path / "pkg" / "c.py").write_text("import pkg.a\n")
    (tmp_path / "pkg" / "d.py").write_text("import pkg.b\ndef f():\n    import pkg.a\n")
    graph = import_graph(project_modules(tmp_path))
    assert graph["pkg.b"] == {"pkg.c"}  # the TYPE_CHECKING import is not an edge
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]  # d -> b is no loop: b -> d is type-checking only
