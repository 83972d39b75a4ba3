"""A user env's source is checked without importing it, packed deterministically and unpacked by its digest."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from trajflow.infra.store import LocalStore
from trajflow.sandbox.user.packages import PackageError, digest_of, extract_files, pack, package_key, publish, unpack
from trajflow.sandbox.user.source import EnvSourceError, check_source, split_env_id

ROOT = Path(__file__).resolve().parents[2]
GOOD = """
class Dice:
    def __init__(self, sides=6):
        self.sides = sides
    def reset(self, seed=None):
        return "roll", {}
    def step(self, action):
        return "ok", 1.0, True, False, {}
"""


def env_dir(tmp_path: Path, source: str = GOOD, module: str = "dice.py", requirements: str | None = None) -> Path:
    root = tmp_path / "env"
    (root / module).parent.mkdir(parents=True, exist_ok=True)
    (root / module).write_text(source)
    if requirements is not None:
        (root / "requirements.txt").write_text(requirements)
    return root


def test_the_shipped_example_passes_the_check() -> None:
    source = check_source("py:factor_env:FactorEnv", ROOT / "examples" / "factoring")
    assert (source.module, source.cls, source.requirements) == ("factor_env", "FactorEnv", ("sympy==1.14.0",))
    assert {"factor_env.py", "requirements.txt", "config.toml"} <= source.files().keys()


def test_a_dotted_module_is_found_as_a_file_or_a_package(tmp_path: Path) -> None:
    assert check_source("py:games.dice:Dice", env_dir(tmp_path, module="games/dice.py")).module == "games.dice"
    assert check_source("py:games:Dice", env_dir(tmp_path / "b", module="games/__init__.py")).module == "games"


@pytest.mark.parametrize(
    ("env_id", "source", "says"),
    [
        ("py:dice", GOOD, "expected py:MODULE:CLASS"),
        ("py:nope:Dice", GOOD, "no module 'nope'"),
        ("py:dice:Die", GOOD, "defines no class 'Die' at its top level (it defines Dice)"),
        ("py:dice:Dice", "class Dice:\n    def step(self, action): ...\n", "has no reset()"),
        ("py:dice:Dice", "class Dice:\n    def reset(self): ...\n    def step(self, a): ...\n", "takes no `seed`"),
        ("py:dice:Dice", "class Dice:\n    def reset(self, seed=None): ...\n    def step(self): ...\n", "no action"),
        (
            "py:dice:Dice",
            "class Dice:\n    def reset(self, seed=None): ...\n    def step(self, a, b): ...\n",
            "requires a, b",
        ),
        (
            "py:dice:Dice",
            "class Dice:\n    async def reset(self, seed=None): ...\n    def step(self, a): ...\n",
            "is async",
        ),
        ("py:dice:Dice", "class Dice(\n", "syntax error"),
    ],
)
def test_a_bad_env_says_what_to_fix(tmp_path: Path, env_id: str, source: str, says: str) -> None:
    with pytest.raises(EnvSourceError) as caught:
        check_source(env_id, env_dir(tmp_path, source))
    assert says in str(caught.value)


def test_inherited_or_imported_classes_are_trusted(tmp_path: Path) -> None:
    check_source("py:dice:Dice", env_dir(tmp_path, "from base import Env\nclass Dice(Env):\n    pass\n"))
    check_source("py:dice:Dice", env_dir(tmp_path / "b", "from elsewhere import Dice\n"))


def test_missing_paths_and_bad_requirements_are_named(tmp_path: Path) -> None:
    with pytest.raises(EnvSourceError, match="needs its source directory"):
        check_source("py:dice:Dice", "")
    with pytest.raises(EnvSourceError, match="is not a directory"):
        check_source("py:dice:Dice", tmp_path / "absent")
    with pytest.raises(EnvSourceError, match=r"requirements.txt:2: 'numpy==' is not a requirement"):
        check_source("py:dice:Dice", env_dir(tmp_path, requirements="# pins\nnumpy==\n"))
    with pytest.raises(EnvSourceError, match="pip options"):
        check_source("py:dice:Dice", env_dir(tmp_path / "c", requirements="--index-url http://x\n"))


def test_split_env_id() -> None:
    assert split_env_id("py:a.b:C") == ("a.b", "C")
    with pytest.raises(EnvSourceError):
        split_env_id("py:a-b:C")


def test_the_package_is_the_same_bytes_for_the_same_files(tmp_path: Path) -> None:
    root = env_dir(tmp_path, requirements="sympy\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "dice.cpython-311.pyc").write_bytes(b"junk")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref")
    files = check_source("py:dice:Dice", root).files()
    assert sorted(files) == ["dice.py", "requirements.txt"]
    assert pack(files) == pack(dict(reversed(list(files.items()))))
    assert package_key(pack(files)) != package_key(pack({**files, "dice.py": b"changed"}))


def test_publish_then_unpack_gives_back_the_files(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    source = check_source("py:dice:Dice", env_dir(tmp_path, requirements="sympy\n"))
    uri = publish(source.files(), store)
    assert publish(source.files(), store) == uri  # content-addressed: published once
    where = unpack(store, uri, tmp_path / "cache")
    assert check_source("py:dice:Dice", where).files() == source.files()
    assert unpack(store, uri, tmp_path / "cache") == where
    assert len(digest_of(uri)) == 64


def test_a_tampered_or_missing_package_is_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    data = pack({"dice.py": GOOD.encode()})
    key = package_key(data)
    uri = store.put_bytes(key, data + b"tampered")
    with pytest.raises(PackageError, match="does not hash to its name"):
        unpack(store, uri, tmp_path / "cache")
    with pytest.raises(PackageError, match="is not in the store"):
        unpack(store, store.uri_for(package_key(b"other")), tmp_path / "cache")
    with pytest.raises(PackageError, match="is not an env package"):
        digest_of("file:///tmp/x.tar")


def _tar_with(member: tarfile.TarInfo, data: bytes = b"") -> tarfile.TarFile:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    return tarfile.open(fileobj=io.BytesIO(out.getvalue()), mode="r:")


@pytest.mark.parametrize(
    "member",
    [tarfile.TarInfo("../escape.py"), tarfile.TarInfo("/abs.py"), tarfile.TarInfo("a/../../b.py")],
    ids=["dotdot", "absolute", "nested-dotdot"],
)
def test_unpacking_refuses_a_member_outside_the_package(tmp_path: Path, member: tarfile.TarInfo) -> None:
    with pytest.raises(PackageError, match="not a plain file at a relative path"):
        extract_files(_tar_with(member, b"x"), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_unpacking_refuses_links_and_needs_no_tarfile_filter(tmp_path: Path) -> None:
    """Debian 12's Python 3.11.2 (the worker image's) has no `extractall(filter=...)`: nothing here relies on it."""
    link = tarfile.TarInfo("env.py")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    with pytest.raises(PackageError, match="'env.py' is not a plain file"):
        extract_files(_tar_with(link), tmp_path)
    extract_files(tarfile.open(fileobj=io.BytesIO(pack({"a/b.py": b"x = 1\n"})), mode="r:"), tmp_path)
    assert (tmp_path / "a" / "b.py").read_bytes() == b"x = 1\n"
