"""A dataset task's own verifier: `env_kwargs = { verifier = "MODULE:FUNCTION" }` names a Python function in a
module beside the task's dataset file, found and checked without importing it (as a user env is, `source.py`).

    def check(response: str, reference: str) -> float | bool: ...
    def check(response: str, reference: str, metadata: dict) -> float | bool: ...   # the row's metadata too

`response` is the model's whole reply, `reference` the row's answer as text. The dataset env calls it in the
sandbox at every reply (`trajflow/envs/dataset.py`): its value is the episode's verdict (True is 1.0; at least 1.0 is a
solved episode), which the reward service's `verifier` reward scores. It runs where the user's requirements are
installed (the task's layer: the module, its package and `requirements.txt` from the same directory), never in the
shared reward service. What goes into the package: MODULE's file (`check.py`), or for a package or a dotted module
(`mychecks.answers`) the whole top-level package directory; and that directory's `requirements.txt` if there is one.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from trajflow.sandbox.user.source import (
    REQUIREMENTS_FILE,
    EnvSourceError,
    bound_at_top_level,
    parse_module,
    read_requirements,
    source_files,
)

_SPEC = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*):([A-Za-z_][A-Za-z0-9_]*)")
SIGNATURE = "FUNCTION(response, reference) or FUNCTION(response, reference, metadata), returning a float or a bool"


@dataclass(frozen=True)
class VerifierSource:
    """A checked verifier: its directory, module, function and requirement lines."""

    root: Path
    module: str
    function: str
    requirements: tuple[str, ...]

    def files(self) -> dict[str, bytes]:
        """The module (or its top-level package) and the requirements file, by POSIX path relative to `root`."""
        top = self.module.split(".")[0]
        files: dict[str, bytes] = {}
        if (self.root / top).is_dir():
            files |= {f"{top}/{rel}": data for rel, data in source_files(self.root / top).items()}
        else:
            files[f"{top}.py"] = (self.root / f"{top}.py").read_bytes()
        if self.requirements:
            files[REQUIREMENTS_FILE] = (self.root / REQUIREMENTS_FILE).read_bytes()
        return files


def check_verifier(spec: object, root: Path, where: str) -> VerifierSource:
    """The verifier `spec` ("MODULE:FUNCTION") in directory `root`, checked; raises EnvSourceError saying what to fix
    (`where` names the task or env in the message)."""
    match = _SPEC.fullmatch(spec) if isinstance(spec, str) else None
    if match is None:
        raise EnvSourceError(
            f'{where}: verifier {spec!r} is not MODULE:FUNCTION (e.g. verifier = "my_check:check", my_check.py '
            f"beside the dataset file)"
        )
    module, function = match.groups()
    path, tree = parse_module(root, module, where, "verifier module")
    _check_function(where, path, tree, function)
    return VerifierSource(root, module, function, read_requirements(root))


def _check_function(where: str, path: Path, tree: ast.Module, name: str) -> None:
    found = next(
        (n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name), None
    )
    if found is None:
        if bound_at_top_level(tree, name):
            return  # imported or assigned at the top level: ast cannot see its signature
        functions = sorted(n.name for n in tree.body if isinstance(n, ast.FunctionDef))
        raise EnvSourceError(
            f"{where}: {path} defines no function {name!r} at its top level"
            + (f" (it defines {', '.join(functions)})" if functions else "")
        )
    if isinstance(found, ast.AsyncFunctionDef):
        raise EnvSourceError(f"{where}: {name} at {path}:{found.lineno} is async; the env calls it synchronously")
    args = found.args
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    required = positional[: len(positional) - len(args.defaults)]
    if len(positional) < 2 and args.vararg is None:
        problem = f"takes {len(positional)} positional argument(s)"
    elif len(required) > 3:
        problem = f"requires {', '.join(required)}"
    elif any(d is None for d in args.kw_defaults):
        problem = "has keyword-only arguments without defaults"
    else:
        return
    raise EnvSourceError(f"{where}: verifier {name} at {path}:{found.lineno} {problem}; a verifier is {SIGNATURE}")


__all__ = ["SIGNATURE", "VerifierSource", "check_verifier"]
