"""Submitting work that names a user env, an agent program or a dataset task: every `py:`, `agent:` and `agent-cmd:`
task's source
(a `data:` task's file) is checked, its requirements resolved into the host's wheel cache (so an unresolvable one
fails here, not in a sandbox), and its package put into the object store; the task (or request) then carries the
package's URI, which every env worker builds its layer from."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trajflow.contracts.config import RunConfig
from trajflow.contracts.store import ObjectStore
from trajflow.contracts.tasks import TaskConfig
from trajflow.contracts.trajectory import TrajectoryRequest
from trajflow.sandbox.builder import npm, wheels
from trajflow.sandbox.user.datasets import check_dataset, is_dataset
from trajflow.sandbox.user.packages import publish
from trajflow.sandbox.user.source import (
    NPM_FILE,
    REQUIREMENTS_FILE,
    EnvSource,
    EnvSourceError,
    check_agent_verifier,
    check_command,
    check_source,
    has_source,
    is_command_env,
    is_user_env,
    read_system_packages,
)
from trajflow.sandbox.user.verifiers import VerifierSource

Say = Callable[[str], None]


def resolve_requirements(source: EnvSource | VerifierSource, wheel_cache: Path, say: Say) -> None:
    """Download the wheels of `source`'s requirements into `wheel_cache` (once per requirement set); raises
    EnvSourceError naming the requirements when pip cannot resolve them."""
    if not source.requirements or wheels.cached_wheels(wheel_cache, source.requirements) is not None:
        return
    say(f"resolving {len(source.requirements)} requirement(s) of {source.module}: {', '.join(source.requirements)}")
    try:
        wheels.download_wheels(wheel_cache, lambda _line: None, source.requirements)
    except RuntimeError as e:
        raise EnvSourceError(
            f"the requirements of {source.root / REQUIREMENTS_FILE} cannot be resolved into wheels for CPython "
            f"3.11 on Linux x86_64 ({', '.join(source.requirements)}); pip said:\n{e}"
        ) from None


def resolve_npm(source: EnvSource, cache: Path, say: Say) -> None:
    """Fetch (once per set) and check the npm packages of `source`'s npm-packages.txt into `cache`; raises
    EnvSourceError naming the package when the registry refuses it or this installer cannot install it."""
    _, specs = read_system_packages(source.root)
    if not specs or npm.cached_tarballs(cache, specs) is not None:
        return
    say(f"fetching {len(specs)} npm package(s) of {source.module}: {', '.join(specs)}")
    try:
        npm.download_tarballs(cache, specs, lambda _line: None)
    except npm.NpmError as e:
        raise EnvSourceError(f"{source.root / NPM_FILE}: {e}") from None


def packaged(env_id: str) -> bool:
    """Whether `env_id` runs from a package the submission publishes (a user env, an agent program, a dataset task)."""
    return has_source(env_id) or is_dataset(env_id)


def package_env(
    env_id: str, env_path: str, store: ObjectStore, wheel_cache: Path, say: Say, env_kwargs: dict | None = None
) -> str:
    """Check, resolve and publish the user env, agent program or dataset `env_id` from `env_path` (a dataset's own
    verifier, named in `env_kwargs`, with it); returns its package URI."""
    if is_dataset(env_id):
        data = check_dataset(env_id, env_path, (env_kwargs or {}).get("verifier"))
        if data.verifier:
            resolve_requirements(data.verifier, wheel_cache, say)
        uri = publish(data.files(), store)
        own = f", verifier {data.verifier.module}:{data.verifier.function}" if data.verifier else ""
        say(f"{env_id}: packaged {data.path} ({data.train_rows} train, {data.test_rows} test rows{own}) as {uri}")
        return uri
    if is_command_env(env_id):
        source = check_command(env_id, env_path, (env_kwargs or {}).get("args", ""))
    else:
        source = check_source(env_id, env_path)
    verifier = (env_kwargs or {}).get("verifier")
    if verifier is not None and not is_user_env(env_id):  # an agent program's own verifier, in its directory
        check_agent_verifier(env_id, env_path, verifier)
    resolve_requirements(source, wheel_cache, say)
    resolve_npm(source, wheel_cache, say)
    uri = publish(source.files(), store, source.executables())
    say(f"{env_id}: packaged {source.root} as {uri}")
    return uri


def publish_task(task: TaskConfig, store: ObjectStore, wheel_cache: Path, say: Say) -> TaskConfig:
    """`task` with its env package set when its env is a `py:`, `agent:` or `data:` one; raises EnvSourceError saying
    what to fix."""
    if not packaged(task.env_id):
        if task.env_path:
            raise EnvSourceError(
                f"task {task.name!r}: env_path is for py:, agent:, agent-cmd: and data: envs, not {task.env_id!r}"
            )
        return task
    try:
        uri = package_env(task.env_id, task.env_path, store, wheel_cache, say, task.env_kwargs)
    except EnvSourceError as e:
        raise EnvSourceError(f"task {task.name!r}: {e}") from None
    return task.model_copy(update={"env_package": uri})


def publish_config(config: RunConfig, store: ObjectStore, wheel_cache: Path, say: Say) -> RunConfig:
    """`config` with every `py:`, `agent:` and `data:` task's package published and set."""
    if not any(packaged(t.env_id) or t.env_path for t in config.tasks):
        return config
    return config.model_copy(update={"tasks": [publish_task(t, store, wheel_cache, say) for t in config.tasks]})


def publish_request(
    req: TrajectoryRequest, env_path: str, store: ObjectStore, wheel_cache: Path, say: Say
) -> TrajectoryRequest:
    """`req` with its env package set when its env is a `py:`, `agent:` or `data:` one (from `env_path`)."""
    if not packaged(req.env_id):
        if env_path:
            raise EnvSourceError(f"--env-path is for py:, agent:, agent-cmd: and data: envs, not {req.env_id!r}")
        return req
    if req.env_package and not env_path:  # published with its task
        return req
    uri = package_env(req.env_id, env_path, store, wheel_cache, say, req.env_kwargs)
    return req.model_copy(update={"env_package": uri})
