"""The env of a dataset task (`data:NAME`): prompts with reference answers from a JSONL or Parquet file, one row
per episode, the row fixed by the seed.

Rows: `prompt` (str), `answer` (str; numbers are read as their text), optional `split` ("train" or "test") and
`metadata`. Without a `split` column every tenth row (index 9, 19, ...) is held out as "test". Seeds below
`held_out_from` (the eval's first seed, 1,000,000 by default) index the train rows (seed mod their count), seeds
from it on index the test rows, so training never sees the held-out prompts and each eval seed is one test row.

Single-turn by default: one reply ends the episode, with the reference in the final info for the reward service's
verifier (`rewards.registry`: `math_verify`, `exact_match`, `regex_match`) and env reward 0. With `attempts` > 1
the env judges each reply itself (`envs/verify.py`, checker `check`): a right one ends the episode with reward 1.0,
a wrong one gets "not correct" and another try, the last wrong one ends it with 0.
Limits: the whole file is read at reset (datasets of tens of MB at most; the package limit is 20 MiB).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

try:  # beside this file in the sandbox image, in the `envs` package on the host
    from envs import verify
except ImportError:  # pragma: no cover — the image's flat layout
    import verify  # type: ignore[no-redef]

HELD_OUT_FROM = 1_000_000
"""`contracts.training.EvalConfig.first_seed`'s default."""
SUFFIXES = (".jsonl", ".parquet")


class DatasetError(ValueError):
    """A dataset file that cannot serve episodes; the message says what is wrong."""


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL or Parquet file, checked: each has a str `prompt` and an `answer`."""
    if path.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise DatasetError(f"{path.name}:{n}: not JSON: {e}") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{path.name}:{n}: a row must be a JSON object")
            rows.append(row)
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    else:
        raise DatasetError(f"{path.name}: a dataset is a .jsonl or .parquet file")
    for n, row in enumerate(rows, 1):
        if not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
            raise DatasetError(f"{path.name}: row {n} has no prompt (a non-empty string)")
        if row.get("answer") is None or isinstance(row["answer"], (dict, list)):
            raise DatasetError(f"{path.name}: row {n} has no answer (a string or a number)")
        if row.get("split", "train") not in ("train", "test"):
            raise DatasetError(f"{path.name}: row {n}: split is {row['split']!r}; it is train or test")
    if not rows:
        raise DatasetError(f"{path.name}: no rows")
    return rows


def splits(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, test rows): by the `split` column, else every tenth row held out."""
    if any("split" in row for row in rows):
        return [r for r in rows if r.get("split", "train") == "train"], [r for r in rows if r.get("split") == "test"]
    return [r for i, r in enumerate(rows) if i % 10 != 9], [r for i, r in enumerate(rows) if i % 10 == 9]


class DatasetEnv:
    def __init__(self, path: str | Path, attempts: int = 1, check: str = "math", held_out_from: int = HELD_OUT_FROM) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {attempts}")
        if check not in verify.CHECKERS:
            raise ValueError(f"unknown check {check!r}; known: {', '.join(verify.CHECKERS)}")
        self.train, self.test = splits(read_rows(Path(path)))
        if not self.train:
            raise DatasetError(f"{Path(path).name}: no train rows")
        self.attempts, self.check, self.held_out_from = attempts, check, held_out_from
        self.row: dict[str, Any] = {}
        self.tries = 0

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        seed = seed or 0
        if seed >= self.held_out_from:
            if not self.test:
                raise DatasetError("a held-out seed, but the dataset has no test rows")
            split, index = "test", (seed - self.held_out_from) % len(self.test)
        else:
            split, index = "train", seed % len(self.train)
        self.row = (self.test if split == "test" else self.train)[index]
        self.tries = 0
        info: dict[str, Any] = {"split": split, "row": index}
        if isinstance(self.row.get("metadata"), dict):
            info.update({f"metadata.{k}": v for k, v in self.row["metadata"].items()})
        return self.row["prompt"], info

    @property
    def answer(self) -> str:
        return str(self.row["answer"])

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.tries += 1
        final = {"answer": self.answer, "tries": self.tries}
        if self.attempts == 1:
            return "Answer recorded.", 0.0, True, False, final
        if verify.check(self.check, action, self.answer):
            return "Correct.", 1.0, True, False, {**final, "solved": True}
        left = self.attempts - self.tries
        if left <= 0:
            return "That is not correct.", 0.0, True, False, {**final, "solved": False}
        return f"That is not correct. {left} attempt(s) left.", 0.0, False, False, {"tries": self.tries}
