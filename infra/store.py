"""The object store: where large data (token ids, trajectories, checkpoints) lives; Temporal history keeps URIs.

Two backends behind one `ObjectStore` protocol:

- `LocalStore(root)`: a directory; URIs `file:///abs/path`. Writes are atomic (a temp file in the same
  directory, then `os.replace`), so a reader sees the old object or the whole new one, never a partial file.
- `S3Store(bucket, prefix=...)`: S3 or anything speaking its protocol (MinIO, moto) through boto3; URIs
  `s3://bucket/key`. S3 PUTs are atomic by nature. Credentials come from the usual AWS environment variables
  or config files (boto3's default chain); nothing here reads or stores them.

`open_store(url)` picks the backend from a URL (`file:///path`, a plain path, or `s3://bucket/prefix`);
`open_store_from(settings)` opens the store the process settings name (what every worker and command uses).
Which keys go where: `trajflow.infra.layout`.

Keys are relative, `/`-separated names (`runs/r1/traj/abc.json`); `..`, `.`, empty segments, absolute keys and
NUL bytes are rejected with a ValueError in both backends, so a key means the same thing everywhere.
A store reads only URIs of its own kind and place: another scheme, another bucket or a path outside the local
root raise ValueError. A missing object raises `ObjectNotFound` (a KeyError) in both.

Thread safety: both backends may be shared between threads. LocalStore keeps no mutable state and each write
uses its own uniquely named temp file; S3Store holds one boto3 *client*, which boto3 documents as thread-safe
(it is created once in `__init__`, never a shared `Session` across threads).

Not covered: multipart uploads of huge objects beyond what boto3's `put_object` takes (5 GiB),
versioning, and cross-process locking (writers of one key race; the last `os.replace`/PUT wins, whole).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlparse

from pydantic import BaseModel

from trajflow.contracts.store import ObjectStore

if TYPE_CHECKING:
    from trajflow.infra.settings import Settings

_TMP_MARK = ".tmp-"
"""Temp files of in-flight local writes carry this in their name; `list` never reports them."""


class ObjectNotFound(KeyError):
    """No object at this URI. A KeyError, so `except KeyError` also catches it."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.uri = uri

    def __str__(self) -> str:
        return f"no object at {self.uri}"


def check_key(key: str) -> str:
    """Return `key` if it is a valid relative object key, else raise ValueError saying why."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"object key must be a non-empty string, got {key!r}")
    if "\x00" in key or "\\" in key:
        raise ValueError(f"object key {key!r} must not contain NUL bytes or backslashes")
    if key.startswith("/"):
        raise ValueError(f"object key {key!r} must be relative (no leading '/')")
    bad = [part for part in key.split("/") if part in ("", ".", "..")]
    if bad:
        raise ValueError(f"object key {key!r} must not contain empty, '.' or '..' segments")
    return key


def _check_prefix(prefix: str) -> str:
    """A list prefix is a key's beginning: empty, or valid as a key once a trailing '/' is dropped."""
    if prefix:
        check_key(prefix.rstrip("/") or "/")
    return prefix


def _dump_json(obj: BaseModel | dict[str, Any]) -> bytes:
    if isinstance(obj, BaseModel):
        return obj.model_dump_json().encode()
    if isinstance(obj, dict):
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    raise TypeError(f"put_json takes a pydantic model or a dict, got {type(obj).__name__}")


def _load_json(data: bytes, uri: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError as e:
        raise ValueError(f"{uri} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{uri} holds JSON {type(value).__name__}, expected an object")
    return value


class LocalStore:
    """Objects as files under `root` (created if missing). URIs are `file:///abs/path`."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def uri_for(self, key: str) -> str:
        return self._path(key).as_uri()

    def _path_of(self, uri: str) -> Path:
        parsed = urlparse(uri)
        if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
            raise ValueError(f"{self!r} reads only file:/// URIs, got {uri!r}")
        path = Path(unquote(parsed.path))
        if not path.is_absolute() or ".." in path.parts or not path.is_relative_to(self.root):
            raise ValueError(f"{uri!r} is outside this store's root {self.root}")
        if path == self.root or _TMP_MARK in path.name:
            raise ValueError(f"{uri!r} does not name an object in {self.root}")
        return path

    def put_bytes(self, key: str, data: bytes) -> str:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # A unique temp name beside the target (same filesystem, so os.replace is atomic); mode 0o666 lets
        # the umask decide permissions, as a plain open() would.
        tmp = path.parent / f".{path.name}{_TMP_MARK}{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            # The temp file must not outlive a failed write; the object itself is untouched.
            Path(tmp).unlink(missing_ok=True)
            raise
        return path.as_uri()

    def get_bytes(self, uri: str) -> bytes:
        path = self._path_of(uri)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFound(uri) from None

    def put_json(self, key: str, obj: BaseModel | dict[str, Any]) -> str:
        return self.put_bytes(key, _dump_json(obj))

    def get_json(self, uri: str) -> dict[str, Any]:
        return _load_json(self.get_bytes(uri), uri)

    def exists(self, uri: str) -> bool:
        return self._path_of(uri).is_file()

    def delete(self, uri: str) -> None:
        self._path_of(uri).unlink(missing_ok=True)

    def put_file(self, key: str, path: Path) -> str:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".{target.name}{_TMP_MARK}{uuid.uuid4().hex}"
        try:
            os.link(path, tmp)  # same filesystem: no copy of a gigabyte checkpoint
        except OSError:
            return self.put_bytes(key, Path(path).read_bytes())
        os.replace(tmp, target)
        return target.as_uri()

    def list(self, prefix: str = "") -> list[str]:
        _check_prefix(prefix)
        # Walk only the deepest directory the prefix pins down, not the whole root.
        base_dir = self.root.joinpath(*prefix.split("/")[:-1]) if "/" in prefix else self.root
        if not base_dir.is_dir():
            return []
        uris: list[str] = []
        for dirpath, _dirs, files in os.walk(base_dir):
            for name in files:
                if _TMP_MARK in name:
                    continue
                path = Path(dirpath, name)
                if path.relative_to(self.root).as_posix().startswith(prefix):
                    uris.append(path.as_uri())
        return sorted(uris)


class S3Store:
    """Objects in one S3 bucket under an optional key prefix. URIs are `s3://bucket/<prefix><key>`.

    `endpoint_url` points at an S3-compatible server (MinIO, moto); None means AWS. With `create_bucket`
    the bucket is created if missing (handy for local servers; production buckets are made by ops).
    """

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        create_bucket: bool = False,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        import boto3  # imported here so `infra` stays importable (and fast) where S3 is not used
        from botocore.config import Config

        if not bucket or "/" in bucket:
            raise ValueError(f"S3 bucket name must be non-empty without '/', got {bucket!r}")
        self.bucket = bucket
        self.prefix = check_key(prefix.strip("/")) + "/" if prefix.strip("/") else ""
        self.endpoint_url = endpoint_url
        key_id, secret = credentials or (None, None)  # None: boto3's own chain (environment, profile, role)
        self._client = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
            config=Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=5, read_timeout=60),
        )
        if create_bucket:
            self._create_bucket(region)

    def __repr__(self) -> str:
        return f"S3Store('s3://{self.bucket}/{self.prefix}', endpoint_url={self.endpoint_url!r})"

    def _create_bucket(self, region: str) -> None:
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        if region != "us-east-1":  # us-east-1 rejects an explicit LocationConstraint
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            self._client.create_bucket(**kwargs)
        except self._client.exceptions.BucketAlreadyOwnedByYou:
            pass

    def _key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def uri_for(self, key: str) -> str:
        return f"s3://{self.bucket}/{quote(self._key(key), safe='/')}"

    def _key_of(self, uri: str) -> str:
        parsed = urlparse(uri)
        if parsed.scheme != "s3":
            raise ValueError(f"{self!r} reads only s3:// URIs, got {uri!r}")
        if parsed.netloc != self.bucket:
            raise ValueError(f"{uri!r} is in bucket {parsed.netloc!r}, this store uses {self.bucket!r}")
        return check_key(unquote(parsed.path).lstrip("/"))

    def put_bytes(self, key: str, data: bytes) -> str:
        self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        return self.uri_for(key)

    def get_bytes(self, uri: str) -> bytes:
        key = self._key_of(uri)
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=key)
        except self._client.exceptions.NoSuchKey:
            raise ObjectNotFound(uri) from None
        body: bytes = response["Body"].read()
        return body

    def put_json(self, key: str, obj: BaseModel | dict[str, Any]) -> str:
        self._client.put_object(
            Bucket=self.bucket, Key=self._key(key), Body=_dump_json(obj), ContentType="application/json"
        )
        return self.uri_for(key)

    def get_json(self, uri: str) -> dict[str, Any]:
        return _load_json(self.get_bytes(uri), uri)

    def exists(self, uri: str) -> bool:
        from botocore.exceptions import ClientError

        key = self._key_of(uri)
        try:
            self._client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def delete(self, uri: str) -> None:
        self._client.delete_object(Bucket=self.bucket, Key=self._key_of(uri))

    def put_file(self, key: str, path: Path) -> str:
        self._client.upload_file(str(path), self.bucket, self._key(key))  # multipart for large files
        return self.uri_for(key)

    def list(self, prefix: str = "") -> list[str]:
        _check_prefix(prefix)
        uris: list[str] = []
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
            for item in page.get("Contents", []):
                uris.append(f"s3://{self.bucket}/{quote(item['Key'], safe='/')}")
        return sorted(uris)


_ACCEPTED = "a local path, a file:///absolute/path URL, or s3://bucket[/prefix]"


def open_store(
    url: str,
    *,
    s3_endpoint_url: str | None = None,
    s3_region: str = "us-east-1",
    create_bucket: bool = False,
    s3_credentials: tuple[str, str] | None = None,
) -> ObjectStore:
    """The store a URL names: `file:///path` or a plain path → LocalStore, `s3://bucket/prefix` → S3Store."""
    if not url:
        raise ValueError(f"empty store URL; expected {_ACCEPTED}")
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"store URL {url!r} names no bucket; expected {_ACCEPTED}")
        return S3Store(
            parsed.netloc,
            prefix=unquote(parsed.path),
            endpoint_url=s3_endpoint_url,
            region=s3_region,
            create_bucket=create_bucket,
            credentials=s3_credentials,
        )
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise ValueError(f"store URL {url!r} is not file:///absolute/path; expected {_ACCEPTED}")
        return LocalStore(Path(unquote(parsed.path)))
    if "://" in url:
        raise ValueError(f"unsupported store URL {url!r}; expected {_ACCEPTED}")
    return LocalStore(Path(url))


def open_store_from(settings: Settings) -> ObjectStore:
    """The store of these process settings: `TRAJFLOW_STORE_URL` (default: a directory under the state dir), with
    the S3 endpoint, region and bucket creation of `TRAJFLOW_S3_*`. A process that names no store while
    `trajflow up --hosts` runs the stack (its layout in the run dir) gets the hosts' S3 store, so that a command on
    this machine publishes env packages and reads trajectories where the hosts do."""
    if settings.store_url is None:
        from trajflow.infra.hosts import hosts_store  # only here: infra.hosts imports this module

        shared = hosts_store(settings)
        if shared is not None:
            return shared
    return open_store(
        settings.resolved_store_url,
        s3_endpoint_url=settings.s3_endpoint_url,
        s3_region=settings.s3_region,
        create_bucket=settings.s3_create_bucket,
    )


__all__ = ["LocalStore", "ObjectNotFound", "ObjectStore", "S3Store", "check_key", "open_store", "open_store_from"]
