"""An `agent-cmd:FILE` program is checked and packed like an `agent:` one: FILE must be a regular file in env_path that
is executable or starts with `#!` (a clear error otherwise), `env_kwargs["args"]` a string a shell splits; execute bits
travel through the package, its unpacking and the user layer's tag; the runner and the contracts agree on the prefix."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import pytest

from trajflow.contracts.agent import AGENT_CMD_PREFIX, is_agent
from trajflow.contracts.env_ids import AGENT_PREFIXES
from trajflow.contracts.tasks import TaskConfig
from trajflow.contracts.trajectory import TrajectoryRequest
from trajflow.envs import runner
from trajflow.envs.agent_cmd import command_argv
from trajflow.infra.store import LocalStore
from trajflow.sandbox.images import ImageResolver, UnknownTask
from trajflow.sandbox.user.packages import unpack
from trajflow.sandbox.user.source import EnvSourceError, check_command, executable_files, has_source
from trajflow.sandbox.user.submit import packaged, publish_request, publish_task
from trajflow.sandbox.user_images import user_image_tag

SCRIPT = "#!/bin/sh\necho hi\n"


def cmd_dir(tmp_path: Path, files: dict[str, tuple[str, int]] | None = None) -> Path:
    """An agent's directory: bin/agent (executable), lib.txt (not), plus `files` (name -> (text, mode))."""
    root = tmp_path / "cmd"
    for name, (text, mode) in {"bin/agent": (SCRIPT, 0o755), "lib.txt": ("data", 0o644), **(files or {})}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
        (root / name).chmod(mode)
    return root


def test_prefixes_agree_and_agent_cmd_is_an_agent_with_source() -> None:
    # one definition: the runner's prefixes are the contracts' objects, not a copy of their values
    assert vars(runner)["env_ids"].AGENT_PREFIXES is AGENT_PREFIXES and AGENT_CMD_PREFIX in AGENT_PREFIXES
    assert (
        is_agent("agent-cmd:run.sh") and is_agent("agent:m:f") and not is_agent("agent-cmd") and not is_agent("py:m:C")
    )
    assert has_source("agent-cmd:run.sh") and packaged("agent-cmd:bin/agent")


def test_an_executable_or_a_shebang_script_passes(tmp_path: Path) -> None:
    root = cmd_dir(tmp_path, {"run.py": ("#!/usr/bin/env python3 -u\nprint(1)\n", 0o644)})
    source = check_command("agent-cmd:bin/agent", root, "--flag 'two words'")
    assert (source.root, source.module, source.requirements) == (root, "bin/agent", ())
    assert source.executables() == frozenset({"bin/agent"}) == executable_files(root)
    assert command_argv(root, "bin/agent", "--flag 'two words'") == [str(root / "bin/agent"), "--flag", "two words"]
    check_command("agent-cmd:run.py", root)  # no execute bit, but a #! line: run through its interpreter
    assert command_argv(root, "run.py", "x") == ["/usr/bin/env", "python3 -u", str(root / "run.py"), "x"]


@pytest.mark.parametrize(
    ("env_id", "args", "says"),
    [
        ("agent-cmd:missing.sh", "", "does not exist"),
        ("agent-cmd:bin", "", "is not a regular file"),
        ("agent-cmd:lib.txt", "", "is neither executable nor a script with a #! line (chmod +x it"),
        ("agent-cmd:../cmd/bin/agent", "", "must not have . or .. parts"),
        ("agent-cmd:bin/my agent", "", "without whitespace"),
        ("agent-cmd:/bin/sh", "", "relative to the program's directory"),
        ("agent-cmd:", "", "non-empty path"),
        ("agent-cmd:.hidden/run", "", "hidden files and __pycache__ are not packed"),
        ("agent-cmd:bin/agent", "'unclosed", "cannot be split as a shell would"),
        ("agent-cmd:bin/agent", 3, "args must be a string"),
    ],
)
def test_a_bad_command_says_what_to_fix(tmp_path: Path, env_id: str, args: object, says: str) -> None:
    root = cmd_dir(tmp_path, {".hidden/run": (SCRIPT, 0o755)})
    with pytest.raises(EnvSourceError, match=re.escape(says)):
        check_command(env_id, root, args)


def test_a_command_without_env_path_is_told_to_give_one(tmp_path: Path) -> None:
    with pytest.raises(EnvSourceError, match='an agent-cmd: program needs its source directory: env_path = "DIR"'):
        check_command("agent-cmd:run.sh", "")
    with pytest.raises(EnvSourceError, match="is not a directory"):
        check_command("agent-cmd:run.sh", tmp_path / "absent")


def test_submission_packs_execute_bits_and_unpacking_keeps_them(tmp_path: Path) -> None:
    store, root, said = LocalStore(tmp_path / "store"), cmd_dir(tmp_path), []
    task = TaskConfig(name="cmd", env_id="agent-cmd:bin/agent", env_path=str(root), env_kwargs={"args": "-v"})
    published = publish_task(task, store, tmp_path / "wheels", said.append)
    assert any("agent-cmd:bin/agent: packaged" in line for line in said)
    with tarfile.open(fileobj=io.BytesIO(store.get_bytes(published.env_package))) as tar:
        assert {m.name: m.mode for m in tar.getmembers()} == {"bin/agent": 0o755, "lib.txt": 0o644}
    unpacked = unpack(store, published.env_package, tmp_path / "cache")
    assert (unpacked / "bin/agent").stat().st_mode & 0o777 == 0o755
    assert (unpacked / "lib.txt").stat().st_mode & 0o111 == 0
    assert executable_files(unpacked) == frozenset({"bin/agent"})  # what the user layer is built and tagged with
    req = TrajectoryRequest(env_id="agent-cmd:bin/agent")
    assert publish_request(req, str(root), store, tmp_path / "w", said.append).env_package == published.env_package
    (root / "bin/agent").chmod(0o644)  # the same bytes, no execute bit: a package of its own
    assert publish_task(task, store, tmp_path / "wheels", said.append).env_package != published.env_package


def test_submission_refuses_a_bad_command_naming_its_task(tmp_path: Path) -> None:
    store, root = LocalStore(tmp_path / "store"), cmd_dir(tmp_path)
    task = TaskConfig(name="cmd", env_id="agent-cmd:lib.txt", env_path=str(root))
    with pytest.raises(EnvSourceError, match="task 'cmd': agent-cmd:lib.txt: .* is neither executable"):
        publish_task(task, store, tmp_path / "w", print)
    bad_args = TaskConfig(name="cmd", env_id="agent-cmd:bin/agent", env_path=str(root), env_kwargs={"args": "'x"})
    with pytest.raises(EnvSourceError, match="cannot be split"):
        publish_task(bad_args, store, tmp_path / "w", print)


def test_the_user_layer_tag_covers_execute_bits_and_a_command_needs_its_package(tmp_path: Path) -> None:
    files = {"run.sh": SCRIPT.encode()}
    plain = user_image_tag("runtime:1", files, (), {})
    assert user_image_tag("runtime:1", files, (), {}, frozenset()) == plain  # tags without executables unchanged
    assert user_image_tag("runtime:1", files, (), {}, frozenset({"run.sh"})) != plain
    resolver = ImageResolver(client=None, cache_dir=tmp_path)  # type: ignore[arg-type]  # never reached
    with pytest.raises(UnknownTask, match="needs its source directory packed"):
        resolver.image_for("agent-cmd:run.sh")
