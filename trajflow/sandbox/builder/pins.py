"""Pinned requirement closures: the distributions a set of requirements needs, at the versions installed here.

An image that must run the project's own code (the worker image) gets exactly the versions the project is tested
with: each root requirement and, transitively, every requirement of an installed distribution whose environment
marker holds for this interpreter, pinned `name==version` to what `importlib.metadata` finds. The result is a
closure, so pip installs it with `--no-deps` and resolves nothing.

Limits: markers are evaluated for this host (Linux x86_64, CPython 3.11, the image's platform too); a requirement
that is not installed here is an error (install it first), never guessed; extras are followed only where a root
names them (`moto[server]`), not where a dependency does.
"""

from __future__ import annotations

import importlib.metadata as metadata

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


class NotInstalled(RuntimeError):
    """A requirement of the closure is not installed in this environment, so its version cannot be pinned."""


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        raise NotInstalled(
            f"{name} is needed for the image but not installed here: install it, then build again"
        ) from None


def pinned_closure(roots: list[str], *, no_follow: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """`name==version` for every distribution the `roots` need (themselves included), sorted by name.

    `no_follow`: distributions pinned themselves but whose own requirements are not followed (a package
    installed `--no-deps` because its declared requirements pull things it does not use)."""
    env = {k: str(v) for k, v in default_environment().items()}
    pins: dict[str, str] = {}
    todo = [(Requirement(r), "") for r in roots]
    skip = {canonicalize_name(n) for n in no_follow}
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({**env, "extra": extra}):
            continue
        name = canonicalize_name(req.name)
        if name in pins:
            continue
        pins[name] = _version(req.name)
        if name in skip:
            continue
        for line in metadata.requires(req.name) or []:
            todo += [(Requirement(line), e) for e in ("", *sorted(req.extras))]
    return tuple(f"{name}=={pins[name]}" for name in sorted(pins))
