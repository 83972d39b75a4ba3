"""A user's own environment, env id `py:MODULE:CLASS`, or agent program, env id `agent:MODULE:FUNCTION`
(`trajflow/envs/agent.py`) or `agent-cmd:FILE` (a command line, `trajflow/envs/agent_cmd.py`), as a directory of source:
found and checked without importing it (the submitting host need not have the env's requirements).

The directory holds MODULE (dotted: `games/dice.py` or `games/dice/__init__.py` for `games.dice`) and, optionally,
`requirements.txt` (pip requirement lines; their wheels are resolved on the host, `trajflow.sandbox.builder.wheels`).
CLASS is defined at the module's top level with the GEM/gymnasium interface, strings in and out:

    class MyEnv:
        def __init__(self, **env_kwargs): ...
        def reset(self, seed=None) -> tuple[str, dict] | str: ...
        def step(self, action: str) -> tuple[str, float, bool, bool, dict]: ...

FUNCTION is a top-level `def` or `async def` taking `(task, seed)`: the agent program's entry point, which the
sandbox's runner imports from the same layer (the layer's directory is first on the sandbox's PYTHONPATH). FILE is a
path relative to the directory (no whitespace, no `.`/`..` parts, no hidden parts) to a regular file that is executable
or starts with `#!`, and `env_kwargs["args"]` (when given) a string a shell can split. An agent program's
`env_kwargs["verifier"]` ("MODULE:FUNCTION", `trajflow/envs/agent_verify.py`) names a module in the same directory
whose top-level FUNCTION takes `(task, seed, result)` (`check_agent_verifier`). Execute bits travel with the
package (`executable_files`), so a compiled harness runs as it does on the host.

The check reads the module with `ast`: the class must be there, and the `reset` and `step` it defines must take a
`seed` keyword and one action; the function must be there and take two positional arguments. What `ast` cannot see is
trusted: methods inherited from a base class, a class made by a decorator, a name imported or assigned at the top
level. Every file of the directory but hidden ones and `__pycache__` goes into the package, at most
`MAX_SOURCE_BYTES` in all.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from trajflow.contracts.env_ids import AGENT_CMD_PREFIX, AGENT_PREFIX, USER_PREFIX
from trajflow.envs.agent_cmd import command_argv, file_problem
from trajflow.envs.agent_verify import verifier_problem

PREFIX = USER_PREFIX
REQUIREMENTS_FILE = "requirements.txt"
DEBIAN_FILE = "debian-packages.txt"
NPM_FILE = "npm-packages.txt"
_DEBIAN_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+")
MAX_SOURCE_BYTES = 20 * 1024 * 1024
"""The packed source rides through the object store to every env worker; data sets belong elsewhere."""
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
INTERFACE = (
    "reset(self, seed=None) -> (observation, info) and step(self, action) -> (observation, reward, terminated, "
    "truncated, info)"
)


class EnvSourceError(ValueError):
    """A user env that cannot work as written; the message says what to fix."""


def is_user_env(env_id: str) -> bool:
    """A `py:MODULE:CLASS` env."""
    return env_id.startswith(PREFIX)


def is_agent_env(env_id: str) -> bool:
    """An `agent:MODULE:FUNCTION` program."""
    return env_id.startswith(AGENT_PREFIX)


def is_command_env(env_id: str) -> bool:
    """An `agent-cmd:FILE` program."""
    return env_id.startswith(AGENT_CMD_PREFIX)


def has_source(env_id: str) -> bool:
    """Whether `env_id` runs from a directory of the user's source (a `py:` env or an `agent:`/`agent-cmd:` program)."""
    return is_user_env(env_id) or is_agent_env(env_id) or is_command_env(env_id)


def split_env_id(env_id: str) -> tuple[str, str]:
    """(MODULE, CLASS) of `py:MODULE:CLASS`, (MODULE, FUNCTION) of `agent:MODULE:FUNCTION`."""
    agent = is_agent_env(env_id)
    module, sep, name = env_id.removeprefix(AGENT_PREFIX if agent else PREFIX).partition(":")
    if has_source(env_id) and sep and _DOTTED.fullmatch(module) and _NAME.fullmatch(name):
        return module, name
    if agent:
        raise EnvSourceError(
            f"{env_id!r} is not an agent env id: expected agent:MODULE:FUNCTION, e.g. agent:solver:run "
            "(MODULE a dotted Python module in the agent's directory, FUNCTION its entry point, called (task, seed))"
        )
    raise EnvSourceError(
        f"{env_id!r} is not a user env id: expected py:MODULE:CLASS, e.g. py:factor_env:FactorEnv "
        "(MODULE a dotted Python module in the env's directory, CLASS the env class in it)"
    )


@dataclass(frozen=True)
class EnvSource:
    """A checked user env or agent program: its directory, module, class (an agent's function) and requirement
    lines."""

    root: Path
    module: str
    cls: str
    """A `py:` env's CLASS; an `agent:` program's FUNCTION."""
    requirements: tuple[str, ...]

    def files(self) -> dict[str, bytes]:
        """Every file of the directory that goes into the package, by POSIX path relative to it, sorted."""
        return source_files(self.root)

    def executables(self) -> frozenset[str]:
        """The packed files with an execute bit."""
        return executable_files(self.root)


def _packed(root: Path) -> list[tuple[str, Path]]:
    """(POSIX path relative to `root`, path) of every file that goes into a package, sorted."""
    packed = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and not any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
            packed.append((rel.as_posix(), path))
    return packed


def source_files(root: Path) -> dict[str, bytes]:
    return {rel: path.read_bytes() for rel, path in _packed(root)}


def executable_files(root: Path) -> frozenset[str]:
    """The files of `source_files(root)` that have an execute bit (user, group or other)."""
    return frozenset(rel for rel, path in _packed(root) if path.stat().st_mode & 0o111)


def module_path(root: Path, module: str) -> Path | None:
    """The file that holds `module` under `root`, or None."""
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def parse_module(root: Path, module: str, where: str, kind: str = "module") -> tuple[Path, ast.Module]:
    """The file of `module` under `root` and its syntax tree; EnvSourceError (prefixed `where`) when it is missing
    or does not parse."""
    path = module_path(root, module)
    if path is None:
        stem = "/".join(module.split("."))
        raise EnvSourceError(f"{where}: no {kind} {module!r} in {root} (expected {stem}.py or {stem}/__init__.py)")
    try:
        return path, ast.parse(path.read_text(), filename=str(path))
    except SyntaxError as e:
        raise EnvSourceError(f"{where}: {path}:{e.lineno}: syntax error: {e.msg}") from None


def read_requirements(root: Path) -> tuple[str, ...]:
    """The requirement lines of `root/requirements.txt` (comments and blanks dropped), checked for form."""
    from packaging.requirements import InvalidRequirement, Requirement

    path = root / REQUIREMENTS_FILE
    if not path.is_file():
        return ()
    lines = []
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-"):
            raise EnvSourceError(
                f"{path}:{n}: pip options ({line.split()[0]}) are not supported; list requirements only"
            )
        try:
            Requirement(line)
        except InvalidRequirement as e:
            raise EnvSourceError(f"{path}:{n}: {line!r} is not a requirement: {e}") from None
        lines.append(line)
    return tuple(lines)


def read_system_packages(root: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The Debian package names of `root/debian-packages.txt` and the npm packages (NAME@VERSION, exact) of
    `root/npm-packages.txt`, one per line (comments and blanks dropped), checked for form."""
    from trajflow.sandbox.builder.npm import NpmError, check_spec

    found: list[tuple[str, ...]] = []
    for name, check in ((DEBIAN_FILE, _debian_problem), (NPM_FILE, check_spec)):
        path, lines = root / name, []
        for n, raw in enumerate(path.read_text().splitlines() if path.is_file() else [], 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            try:
                check(line)
            except (NpmError, ValueError) as e:
                raise EnvSourceError(f"{path}:{n}: {e}") from None
            lines.append(line)
        found.append(tuple(lines))
    return found[0], found[1]


def _debian_problem(name: str) -> None:
    if not _DEBIAN_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a Debian package name (one name per line, no version, no options)")


def check_source(env_id: str, env_path: str | Path) -> EnvSource:
    """The user env `env_id` in directory `env_path`, checked; raises EnvSourceError saying what to fix."""
    module, cls = split_env_id(env_id)
    root = _root(env_id, env_path, "an agent: program" if is_agent_env(env_id) else "a py: env")
    path, tree = parse_module(root, module, env_id)
    if is_agent_env(env_id):
        _check_function(env_id, path, tree, cls)
    else:
        _check_class(env_id, path, tree, cls)
    _check_size(env_id, root)
    return EnvSource(root, module, cls, read_requirements(root))


def check_command(env_id: str, env_path: str | Path, args: object = "") -> EnvSource:
    """The `agent-cmd:FILE` program `env_id` in directory `env_path` run with `args` (`env_kwargs["args"]`),
    checked; raises EnvSourceError saying what to fix. Its EnvSource's `module` is FILE."""
    file = env_id.removeprefix(AGENT_CMD_PREFIX)
    problem = file_problem(file)
    if problem:
        raise EnvSourceError(
            f"{env_id!r} is not an agent-cmd: env id: {problem} (e.g. agent-cmd:run.sh, agent-cmd:bin/agent)"
        )
    if any(part.startswith(".") or part == "__pycache__" for part in file.split("/")):
        raise EnvSourceError(f"{env_id}: hidden files and __pycache__ are not packed: move {file} out of them")
    root = _root(env_id, env_path, "an agent-cmd: program")
    try:
        command_argv(root, file, args)
    except ValueError as e:
        raise EnvSourceError(str(e)) from None
    _check_size(env_id, root)
    return EnvSource(root, file, "", read_requirements(root))


def _root(env_id: str, env_path: str | Path, kind: str) -> Path:
    if not str(env_path):
        raise EnvSourceError(
            f'{env_id}: {kind} needs its source directory: env_path = "DIR" in the task (relative to the config '
            "file) or --env-path DIR"
        )
    root = Path(env_path).expanduser().resolve()
    if not root.is_dir():
        raise EnvSourceError(f"{env_id}: env_path {str(env_path)!r} is not a directory")
    return root


def _check_size(env_id: str, root: Path) -> None:
    total = sum(len(data) for data in source_files(root).values())
    if total > MAX_SOURCE_BYTES:
        raise EnvSourceError(
            f"{env_id}: {root} holds {total / 2**20:.1f} MiB of files, over the {MAX_SOURCE_BYTES // 2**20} MiB a "
            "packed env may have: keep data sets out of the env's directory (load them in the env from a path or URL)"
        )


def bound_at_top_level(tree: ast.Module, name: str) -> bool:
    """Whether the module imports or assigns `name` at its top level (what `ast` alone cannot look into)."""
    return any(
        isinstance(n, (ast.Import, ast.ImportFrom))
        and any((a.asname or a.name) == name for a in n.names)
        or isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)
        for n in tree.body
    )


def _check_class(env_id: str, path: Path, tree: ast.Module, cls: str) -> None:
    found = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
    if found is None:
        if bound_at_top_level(tree, cls):
            return  # imported or assigned at the top level: ast cannot see its methods
        classes = sorted(n.name for n in tree.body if isinstance(n, ast.ClassDef))
        raise EnvSourceError(
            f"{env_id}: {path} defines no class {cls!r} at its top level"
            + (f" (it defines {', '.join(classes)})" if classes else "")
        )
    methods = {n.name: n for n in found.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for name in ("reset", "step"):
        method = methods.get(name)
        if method is None:
            if found.bases:
                continue  # perhaps inherited
            raise EnvSourceError(f"{env_id}: class {cls} in {path} has no {name}(); an env needs {INTERFACE}")
        if isinstance(method, ast.AsyncFunctionDef):
            raise EnvSourceError(f"{env_id}: {cls}.{name} is async; the runner calls it synchronously: make it a def")
        problem = _reset_problem(method.args) if name == "reset" else _step_problem(method.args)
        if problem:
            raise EnvSourceError(
                f"{env_id}: {cls}.{name} at {path}:{method.lineno} {problem}; an env needs {INTERFACE}"
            )


def check_agent_verifier(env_id: str, env_path: str | Path, verifier: object) -> None:
    """An agent program's `env_kwargs["verifier"]` ("MODULE:FUNCTION", `trajflow/envs/agent_verify.py`): MODULE in
    `env_path`, FUNCTION a top-level def taking (task, seed, result); raises EnvSourceError saying what to fix."""
    problem = verifier_problem(verifier)
    if problem or not isinstance(verifier, str):
        raise EnvSourceError(f"{env_id}: {problem} (MODULE a module in the program's directory, env_path)")
    module, _, function = verifier.partition(":")
    root = _root(env_id, env_path, "an agent program's verifier")
    path, tree = parse_module(root, module, f"{env_id}: verifier {verifier}", "verifier module")
    _check_function(env_id, path, tree, function, ("task", "seed", "result"), "the verifier")


def _check_function(
    env_id: str,
    path: Path,
    tree: ast.Module,
    function: str,
    params: tuple[str, ...] = ("task", "seed"),
    what: str = "an agent program's entry point",
) -> None:
    """FUNCTION is a top-level def or async def that can be called with `params`, positionally."""
    call = f"{function}({', '.join(params)})"
    found = next((n for n in tree.body if getattr(n, "name", None) == function), None)
    if found is None:
        if bound_at_top_level(tree, function):
            return  # imported or assigned at the top level: ast cannot see what it is
        functions = sorted(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
        raise EnvSourceError(
            f"{env_id}: {path} defines no function {function!r} at its top level"
            + (f" (it defines {', '.join(functions)})" if functions else "")
        )
    if not isinstance(found, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise EnvSourceError(
            f"{env_id}: {function} at {path}:{found.lineno} is a class, not a function; {what} is a top-level def "
            f"or async def {call}"
        )
    args = found.args
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    n = len(params)
    if (len(positional) < n and args.vararg is None) or len(_required_positional(args)) > n or None in args.kw_defaults:
        raise EnvSourceError(
            f"{env_id}: {what} {function} at {path}:{found.lineno} cannot be called as {call}: the runner passes "
            f"exactly those {n} arguments, positionally"
        )


def _reset_problem(args: ast.arguments) -> str:
    named = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    if "seed" not in named and args.kwarg is None:
        return "takes no `seed` argument (the runner calls reset(seed=SEED))"
    required = _required_positional(args)
    if len(required) > 1 and required[1] != "seed":
        return f"requires {', '.join(required[1:])} (the runner passes only seed)"
    return ""


def _step_problem(args: ast.arguments) -> str:
    required = _required_positional(args)
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    if len(positional) < 2 and args.vararg is None:
        return "takes no action argument (the runner calls step(action))"
    if len(required) > 2:
        return f"requires {', '.join(required[1:])} (the runner passes only the action)"
    if any(d is None for d in args.kw_defaults):
        return "has keyword-only arguments without defaults (the runner passes only the action)"
    return ""


def _required_positional(args: ast.arguments) -> list[str]:
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    return positional[: len(positional) - len(args.defaults)]
