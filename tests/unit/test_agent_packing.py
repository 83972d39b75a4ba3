"""An `agent:MODULE:FUNCTION` program is packed like a `py:` env: its source checked without importing it, published
at submission, and its image built from the package (one without a package is refused, saying it needs env_path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trajflow.contracts.tasks import TaskConfig
from trajflow.contracts.trajectory import TrajectoryRequest
from trajflow.infra.store import LocalStore
from trajflow.sandbox.errors import ImageBuildError
from trajflow.sandbox.images import ImageResolver, UnknownTask
from trajflow.sandbox.user.packages import publish, unpack
from trajflow.sandbox.user.source import EnvSourceError, check_source, has_source, split_env_id
from trajflow.sandbox.user.submit import packaged, publish_request, publish_task

AGENT = """
import json, os, urllib.request

def helper(task, seed):
    return 1

async def solve(task, seed):
    return 1.0
"""


def agent_dir(tmp_path: Path, source: str = AGENT, module: str = "solver.py", requirements: str | None = None) -> Path:
    root = tmp_path / "agent"
    (root / module).parent.mkdir(parents=True, exist_ok=True)
    (root / module).write_text(source)
    if requirements is not None:
        (root / "requirements.txt").write_text(requirements)
    return root


def test_a_good_agent_module_passes_with_its_requirements_and_files(tmp_path: Path) -> None:
    root = agent_dir(tmp_path, requirements="# pinned\nrequests==2.32.3\n")
    (root / "prompts").mkdir()
    (root / "prompts" / "system.txt").write_text("be brief")
    source = check_source("agent:solver:solve", root)
    assert (source.module, source.cls, source.requirements) == ("solver", "solve", ("requests==2.32.3",))
    assert set(source.files()) == {"solver.py", "requirements.txt", "prompts/system.txt"}
    assert check_source("agent:solver:helper", root).cls == "helper"  # a plain def too
    assert has_source("agent:solver:solve") and packaged("agent:solver:solve")
    assert split_env_id("agent:pkg.mod:run") == ("pkg.mod", "run")


def test_a_dotted_agent_module_may_be_a_package(tmp_path: Path) -> None:
    root = agent_dir(tmp_path, module="bots/__init__.py")
    assert check_source("agent:bots:solve", root).module == "bots"


def test_a_function_imported_at_the_top_level_is_trusted(tmp_path: Path) -> None:
    root = agent_dir(tmp_path, source="from impl import solve\n")
    assert check_source("agent:solver:solve", root).cls == "solve"


@pytest.mark.parametrize(
    ("env_id", "source", "says"),
    [
        ("agent:solver", AGENT, "expected agent:MODULE:FUNCTION"),
        ("agent:solver:run-it", AGENT, "expected agent:MODULE:FUNCTION"),
        ("agent:nope:solve", AGENT, "no module 'nope'"),
        ("agent:solver:run", AGENT, "defines no function 'run' at its top level (it defines helper, solve)"),
        ("agent:solver:Solver", "class Solver:\n    pass\n", "Solver at "),
        ("agent:solver:solve", "def solve(task):\n    return 1\n", "cannot be called as solve(task, seed)"),
        ("agent:solver:solve", "def solve(task, seed, model):\n    return 1\n", "cannot be called"),
        ("agent:solver:solve", "def solve(task, seed, *, model):\n    return 1\n", "cannot be called"),
        ("agent:solver:solve", "def solve(task, seed:\n", "syntax error"),
    ],
)
def test_a_broken_agent_says_what_to_fix(tmp_path: Path, env_id: str, source: str, says: str) -> None:
    with pytest.raises(EnvSourceError) as e:
        check_source(env_id, agent_dir(tmp_path, source=source))
    assert says in str(e.value)
    if "Solver at" in says:
        assert "is a class, not a function" in str(e.value)


def test_flexible_signatures_are_accepted(tmp_path: Path) -> None:
    for source in ("def solve(*args): ...\n", "def solve(task, seed=0, *, model='x'): ...\n"):
        assert check_source("agent:solver:solve", agent_dir(tmp_path / str(len(source)), source=source))


def test_an_agent_without_env_path_is_told_to_give_one(tmp_path: Path) -> None:
    with pytest.raises(EnvSourceError, match="an agent: program needs its source directory: env_path"):
        check_source("agent:solver:solve", "")
    with pytest.raises(EnvSourceError, match="is not a directory"):
        check_source("agent:solver:solve", tmp_path / "missing")


def test_bad_requirements_are_refused_as_for_py_envs(tmp_path: Path) -> None:
    with pytest.raises(EnvSourceError, match="pip options"):
        check_source("agent:solver:solve", agent_dir(tmp_path, requirements="-e .\n"))


def test_submission_publishes_an_agent_task_and_request(tmp_path: Path) -> None:
    store, root, said = LocalStore(tmp_path / "store"), agent_dir(tmp_path), []
    task = TaskConfig(name="bot", env_id="agent:solver:solve", env_path=str(root))
    published = publish_task(task, store, tmp_path / "wheels", said.append)
    unpacked = unpack(store, published.env_package, tmp_path / "cache")
    assert sorted(p.name for p in unpacked.iterdir() if not p.name.startswith(".")) == ["solver.py"]
    assert any("agent:solver:solve: packaged" in line for line in said)
    req = publish_request(TrajectoryRequest(env_id="agent:solver:solve"), str(root), store, tmp_path / "w", said.append)
    assert req.env_package == published.env_package  # content-addressed: the same source, the same package


def test_submission_refuses_an_agent_task_without_env_path_and_env_path_on_other_kinds(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    with pytest.raises(EnvSourceError, match="task 'bot': agent:solver:solve: an agent: program needs its source"):
        publish_task(TaskConfig(name="bot", env_id="agent:solver:solve"), store, tmp_path / "w", print)
    with pytest.raises(EnvSourceError, match="env_path is for py:, agent:, agent-cmd: and data: envs"):
        publish_task(TaskConfig(name="g", env_path=str(tmp_path)), store, tmp_path / "w", print)


def test_the_image_of_an_agent_env_needs_its_package(tmp_path: Path) -> None:
    resolver = ImageResolver(client=None, cache_dir=tmp_path)  # type: ignore[arg-type]  # never reached
    with pytest.raises(
        UnknownTask, match="an agent: program needs its source directory packed: give the task env_path"
    ):
        resolver.image_for("agent:solver:solve")


def test_the_image_of_an_agent_env_is_its_user_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trajflow.sandbox.user_images as user_images

    store = LocalStore(tmp_path / "store")
    uri = publish(check_source("agent:solver:solve", agent_dir(tmp_path)).files(), store)
    built: list[Path] = []
    monkeypatch.setattr(user_images, "ensure_user_image", lambda _c, _d, pkg, _p: built.append(pkg) or "userenv:x")
    resolver = ImageResolver(None, tmp_path, unpack=lambda u: tmp_path / u.rsplit("/", 1)[-1])  # type: ignore[arg-type]
    assert resolver.image_for("agent:solver:solve", uri) == "userenv:x"
    assert resolver.image_for("agent:solver:solve", uri) == "userenv:x" and len(built) == 1  # remembered
    no_store = ImageResolver(None, tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ImageBuildError, match="without a store for user env packages"):
        no_store.image_for("agent:solver:solve", uri)
