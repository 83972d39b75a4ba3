"""A dataset task (`data:NAME`): its JSONL or Parquet file, checked on the submitting host as the dataset env will
read it (`trajflow/envs/dataset.py`), and packaged as one file named NAME.jsonl or NAME.parquet, which the env's image
layer holds (the same layer and package path as a user env's source)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from trajflow.contracts.env_ids import DATA_PREFIX
from trajflow.envs.dataset import SUFFIXES, DatasetError, read_rows, splits
from trajflow.sandbox.user.source import MAX_SOURCE_BYTES, EnvSourceError
from trajflow.sandbox.user.verifiers import VerifierSource, check_verifier

PREFIX = DATA_PREFIX
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")


def is_dataset(env_id: str) -> bool:
    return env_id.startswith(PREFIX)


@dataclass(frozen=True)
class DatasetSource:
    name: str
    path: Path
    train_rows: int
    test_rows: int
    verifier: VerifierSource | None = None

    @property
    def requirements(self) -> tuple[str, ...]:
        return self.verifier.requirements if self.verifier else ()

    def files(self) -> dict[str, bytes]:
        files = self.verifier.files() if self.verifier else {}
        return files | {f"{self.name}{self.path.suffix}": self.path.read_bytes()}


def check_dataset(env_id: str, env_path: str | Path, verifier: object = None) -> DatasetSource:
    """The dataset of `env_id` in file `env_path` (and its `verifier`, "MODULE:FUNCTION" beside the file, when the
    task names one), checked; raises EnvSourceError saying what to fix."""
    name = env_id.removeprefix(PREFIX)
    if not _NAME.fullmatch(name):
        raise EnvSourceError(
            f"{env_id!r}: a dataset task's id is data:NAME, NAME in lower-case letters, digits, - and _"
        )
    if not str(env_path):
        raise EnvSourceError(f'{env_id}: a data: task needs its file: env_path = "FILE.jsonl" (or .parquet)')
    path = Path(env_path).expanduser().resolve()
    if not path.is_file() or path.suffix not in SUFFIXES:
        raise EnvSourceError(f"{env_id}: env_path {str(env_path)!r} is not a .jsonl or .parquet file")
    if path.stat().st_size > MAX_SOURCE_BYTES:
        raise EnvSourceError(f"{env_id}: {path.name} is over {MAX_SOURCE_BYTES // 2**20} MiB: ship a smaller sample")
    try:
        train, test = splits(read_rows(path))
    except DatasetError as e:
        raise EnvSourceError(f"{env_id}: {e}") from None
    if not train:
        raise EnvSourceError(f"{env_id}: {path.name} has no train rows")
    checked = None if verifier is None else check_verifier(verifier, path.parent, env_id)
    return DatasetSource(name, path, len(train), len(test), checked)
