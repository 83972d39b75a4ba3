"""LocalStore (round trips, atomic writes, key validation, ObjectNotFound) and open_store's URL parsing."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from trajflow.contracts.scoring import ScoreResult
from trajflow.infra.store import LocalStore, ObjectNotFound, ObjectStore, S3Store, open_store


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


def _visible_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_bytes_round_trip_with_file_uris(store: LocalStore) -> None:
    uri = store.put_bytes("runs/r1/tokens.bin", b"\x00\x01\xff")
    assert uri == (store.root / "runs" / "r1" / "tokens.bin").as_uri()
    assert uri.startswith("file:///") and uri == store.uri_for("runs/r1/tokens.bin")
    assert store.get_bytes(uri) == b"\x00\x01\xff"
    assert store.exists(uri)
    assert isinstance(store, ObjectStore)


def test_json_round_trip_of_dicts_and_models(store: LocalStore) -> None:
    uri = store.put_json("a.json", {"x": [1, 2], "y": None})
    assert store.get_json(uri) == {"x": [1, 2], "y": None}
    model = ScoreResult(reward=0.5, reward_fn="env_outcome", details={"turns": 3})
    uri = store.put_json("m.json", model)
    assert ScoreResult.model_validate(store.get_json(uri)) == model


def test_get_json_of_a_non_object_is_a_value_error(store: LocalStore) -> None:
    uri = store.put_bytes("list.json", b"[1, 2]")
    with pytest.raises(ValueError, match="expected an object"):
        store.get_json(uri)
    uri = store.put_bytes("junk.json", b"{nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        store.get_json(uri)
    with pytest.raises(TypeError):
        store.put_json("x.json", [1, 2])  # type: ignore[arg-type]


def test_overwrite_replaces_whole_and_leaves_no_temp_files(store: LocalStore) -> None:
    uri = store.put_bytes("k", b"first version, longer")
    assert store.put_bytes("k", b"second") == uri
    assert store.get_bytes(uri) == b"second"
    assert _visible_files(store.root) == ["k"]


def test_a_failed_write_keeps_the_old_object_and_no_temp_file(
    store: LocalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = store.put_bytes("k", b"old")

    def fail_replace(src: str, dst: str) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", fail_replace)
    with pytest.raises(OSError, match="disk on fire"):
        store.put_bytes("k", b"new")
    monkeypatch.undo()
    assert store.get_bytes(uri) == b"old"
    assert _visible_files(store.root) == ["k"]


def test_readers_never_see_a_partial_object(store: LocalStore) -> None:
    """A writer alternates two large payloads; every concurrent read is one of them, whole."""
    payloads = (b"a" * 300_000, b"b" * 200_000)
    uri = store.put_bytes("hot/obj", payloads[0])
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set():
            store.put_bytes("hot/obj", payloads[i % 2])
            i += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        seen = {store.get_bytes(uri) for _ in range(300)}
    finally:
        stop.set()
        writer.join(timeout=10)
    assert seen <= set(payloads)
    assert store.list("hot/") == [uri]  # in-flight temp files are never listed


def test_list_by_prefix(store: LocalStore) -> None:
    for key in ["runs/r1/a", "runs/r1/b/c", "runs/r10/a", "runs/r2/a", "top"]:
        store.put_bytes(key, b"x")
    assert store.list("runs/r1/") == [store.uri_for("runs/r1/a"), store.uri_for("runs/r1/b/c")]
    assert store.list("runs/r1") == [store.uri_for(k) for k in ["runs/r1/a", "runs/r1/b/c", "runs/r10/a"]]
    assert len(store.list()) == 5
    assert store.list("nothing/here/") == []


@pytest.mark.parametrize("key", ["", "/abs/key", "../escape", "a/../../b", "a//b", "a/./b", "a/", "a\\b", "a\x00b"])
def test_bad_keys_are_value_errors(store: LocalStore, key: str) -> None:
    with pytest.raises(ValueError, match="object key"):
        store.put_bytes(key, b"x")
    with pytest.raises(ValueError, match="object key"):
        store.uri_for(key)


def test_missing_object_is_object_not_found(store: LocalStore) -> None:
    uri = store.uri_for("never/written")
    assert not store.exists(uri)
    with pytest.raises(ObjectNotFound) as info:
        store.get_bytes(uri)
    assert info.value.uri == uri and uri in str(info.value)
    with pytest.raises(KeyError):  # ObjectNotFound is a KeyError
        store.get_json(uri)
    store.put_bytes("dir/obj", b"x")
    with pytest.raises(ObjectNotFound):
        store.get_bytes(store.uri_for("dir"))  # a directory is not an object


def test_foreign_uris_are_value_errors(store: LocalStore, tmp_path: Path) -> None:
    other = LocalStore(tmp_path / "other")
    foreign = other.put_bytes("k", b"x")
    for uri in [foreign, "s3://bucket/k", f"file://{store.root}/../other/k", "file://somehost/etc/passwd", "k"]:
        with pytest.raises(ValueError):
            store.get_bytes(uri)


def test_open_store_local_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = open_store(str(tmp_path / "plain"))
    assert isinstance(plain, LocalStore) and plain.root == tmp_path.resolve() / "plain"
    from_url = open_store((tmp_path / "url").as_uri())
    assert isinstance(from_url, LocalStore) and from_url.root == tmp_path.resolve() / "url"
    monkeypatch.chdir(tmp_path)
    relative = open_store("relative/dir")  # a relative path resolves against the cwd, once
    assert isinstance(relative, LocalStore) and relative.root == tmp_path.resolve() / "relative" / "dir"
    assert relative.put_bytes("k", b"x").startswith("file:///")


def test_open_store_s3_forms() -> None:
    store = open_store("s3://my-bucket/runs/exp1/", s3_endpoint_url="http://127.0.0.1:1")
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix) == ("my-bucket", "runs/exp1/")
    assert store.uri_for("t/1.json") == "s3://my-bucket/runs/exp1/t/1.json"
    bare = open_store("s3://my-bucket")
    assert isinstance(bare, S3Store) and bare.prefix == "" and bare.uri_for("k") == "s3://my-bucket/k"
    # URIs of another bucket or backend are refused before any I/O.
    with pytest.raises(ValueError, match="bucket"):
        store.get_bytes("s3://other-bucket/k")
    with pytest.raises(ValueError, match="s3://"):
        store.get_bytes("file:///tmp/k")


@pytest.mark.parametrize("url", ["", "http://example.com/x", "gs://bucket/x", "s3://", "file://host/x", "file:rel"])
def test_open_store_rejects_other_urls(url: str) -> None:
    with pytest.raises(ValueError, match="s3://bucket"):
        open_store(url)


def test_delete_removes_an_object_and_is_idempotent(store: LocalStore) -> None:
    uri = store.put_bytes("runs/r1/a.bin", b"x")
    keep = store.put_bytes("runs/r1/b.bin", b"y")
    store.delete(uri)
    assert not store.exists(uri) and store.exists(keep)
    store.delete(uri)  # already gone: fine
    with pytest.raises(ValueError):
        store.delete("s3://bucket/runs/r1/b.bin")


def test_put_file_links_or_copies_whole(store: LocalStore, tmp_path: Path) -> None:
    src = tmp_path / "weights.bin"
    src.write_bytes(b"w" * 1000)
    uri = store.put_file("runs/r/v1/weights.bin", src)
    assert store.get_bytes(uri) == b"w" * 1000
    assert store.list("runs/r/") == [uri]  # no temp file left
