"""What an object store offers (`ObjectStore`), named here so that code below infra (a user's env packed on the host,
`trajflow.sandbox.user`) takes a store without importing its backends; the local and S3 backends are
`trajflow.infra.store`'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel


@runtime_checkable
class ObjectStore(Protocol):
    """What every backend offers. Keys are relative `/`-separated names; every method but `uri_for` does I/O."""

    def put_bytes(self, key: str, data: bytes) -> str:
        """Write `data` under `key` (replacing any object there) and return its URI."""
        ...

    def get_bytes(self, uri: str) -> bytes:
        """The bytes at `uri`; ObjectNotFound if absent, ValueError if the URI is not this store's."""
        ...

    def put_json(self, key: str, obj: BaseModel | dict[str, Any]) -> str:
        """Write a pydantic model or a dict as UTF-8 JSON and return its URI."""
        ...

    def get_json(self, uri: str) -> dict[str, Any]:
        """The JSON object at `uri`, as a dict (validate it with `Model.model_validate`)."""
        ...

    def exists(self, uri: str) -> bool:
        """Whether an object is at `uri`."""
        ...

    def uri_for(self, key: str) -> str:
        """The URI `put_bytes(key, ...)` returns, without writing anything."""
        ...

    def delete(self, uri: str) -> None:
        """Remove the object at `uri`; absent objects are fine (deleting is idempotent)."""
        ...

    def put_file(self, key: str, path: Path) -> str:
        """Store the file at `path` under `key` (for large files: checkpoints, weights); returns its URI. The
        file must not change afterwards (a local store may hard-link it instead of copying)."""
        ...

    def list(self, prefix: str = "") -> list[str]:
        """URIs of all objects whose key starts with `prefix` (a plain string prefix, as in S3), sorted."""
        ...
