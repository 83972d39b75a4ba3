"""The env of a dataset task (`data:NAME`): prompts with reference answers from a JSONL or Parquet file, one row
per episode, the row fixed by the seed.

Rows: `prompt` (str), `answer` (str; numbers are read as their text), optional `split` ("train" or "test") and
`metadata`. Without a `split` column every tenth row (index 9, 19, ...) is held out as "test". Seeds below
`held_out_from` (the eval's first seed, 1,000,000 by default) index the train rows (seed mod their count), seeds
from it on index the test rows, so training never sees the held-out prompts and each eval seed is one test row.

Every reply is judged here: by the checker `check` (`trajflow/envs/verify.py`: math, exact or regex), or by the task's
own `verifier` ("MODULE:FUNCTION", a function of the user's package on the image's path,
`trajflow/sandbox/user/verifiers.py`), whose value (True is 1.0) is the verdict. Single-turn by default: one reply ends
the episode with the verdict as the env reward, and the reference and verdict (`answer`, `verified`) in the final info
for the reward service (`trajflow.rewards.registry`: `math_verify`, `exact_match`, `regex_match` judge the reference
again; `verifier` takes the verdict). With `attempts` > 1 a verdict of at least 1.0 ends the episode, a lower one gets
"not correct" and another try, and the last one ends it with its verdict.
Limits: the whole file is read at reset (datasets of tens of MB at most; the package limit is 20 MiB).
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:  # beside this file in the sandbox image, in the `envs` package on the host
    from trajflow.envs import verify
except ImportError:  # pragma: no cover — the image's flat layout
    import verify

HELD_OUT_FROM = 1_000_000
"""`trajflow.contracts.training.EvalConfig.first_seed`'s default."""
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


def load_verifier(spec: str) -> Callable[[str, str, dict[str, Any]], float]:
    """The user's verifier "MODULE:FUNCTION" (importable: the user env layer is on the path) as a function of
    (response, reference, metadata) -> verdict; DatasetError when it cannot be loaded."""
    module_name, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), name)
    except Exception as e:  # the user's module fails to import, or lacks the function
        raise DatasetError(f"verifier {spec!r} cannot be loaded: {type(e).__name__}: {e}") from e
    try:
        params = inspect.signature(fn).parameters.values()
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
        three = len(positional) >= 3 or any(p.kind is p.VAR_POSITIONAL for p in positional)
    except (TypeError, ValueError):  # a builtin without a signature: called with two
        three = False

    def verdict(response: str, reference: str, metadata: dict[str, Any]) -> float:
        value = fn(response, reference, metadata) if three else fn(response, reference)
        if isinstance(value, bool):
            return float(value)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise DatasetError(f"verifier {spec!r} returned {value!r:.80}; a verifier returns a finite float or a bool")
        return float(value)

    return verdict


class DatasetEnv:
    def __init__(
        self,
        path: str | Path,
        attempts: int = 1,
        check: str = "math",
        held_out_from: int = HELD_OUT_FROM,
        verifier: str = "",
    ) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {attempts}")
        if check not in verify.CHECKERS:
            raise ValueError(f"unknown check {check!r}; known: {', '.join(verify.CHECKERS)}")
        self.train, self.test = splits(read_rows(Path(path)))
        if not self.train:
            raise DatasetError(f"{Path(path).name}: no train rows")
        self.attempts, self.check, self.held_out_from = attempts, check, held_out_from
        self.verifier = load_verifier(verifier) if verifier else None
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

    def judge(self, action: str) -> float:
        """The reply's verdict: the user's verifier's value, else 1.0 or 0.0 by the checker."""
        if self.verifier is not None:
            metadata = self.row.get("metadata")
            return self.verifier(action, self.answer, metadata if isinstance(metadata, dict) else {})
        return 1.0 if verify.check(self.check, action, self.answer) else 0.0

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.tries += 1
        verdict = self.judge(action)
        final = {"answer": self.answer, "tries": self.tries, "verified": verdict, "solved": verdict >= 1.0}
        if self.attempts == 1:
            return "Answer recorded.", verdict, True, False, final
        if verdict >= 1.0:
            return "Correct.", verdict, True, False, final
        left = self.attempts - self.tries
        if left <= 0:
            return "That is not correct.", verdict, True, False, final
        return f"That is not correct. {left} attempt(s) left.", 0.0, False, False, {"tries": self.tries}
