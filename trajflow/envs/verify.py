"""Answer checkers for dataset tasks (`data:NAME`): shared by the reward service (the verifier rewards) and the
dataset env in the sandbox (feedback between attempts of a multi-turn task), so both judge alike.

`extract_answer` takes the last `\\boxed{...}` of a reply, else its last non-empty line. Checkers take the
extracted answer and the dataset's reference:
- `exact`: equal after trimming, case folding and collapsing whitespace;
- `regex`: the reference is a Python regular expression that must match the whole answer;
- `math`: `math_verify` (HuggingFace's Math-Verify) when it can be imported, parsing both sides (LaTeX or plain
  expressions, so 0.5, 1/2 and \\frac{1}{2} agree), else a numeric comparison. Math-Verify's own timeouts use
  signal.alarm, which works only in a main thread (the reward service and the runner answer from threads), so
  they are off and the inputs are capped at `MAX_MATH_CHARS` instead.

Limits: stdlib only, `math_verify` imported lazily (it is in the runtime image and the host's environment).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

Checker = Callable[[str, str], bool]
MAX_MATH_CHARS = 300
"""Longer answers are compared as text: Math-Verify runs here without its timeout (see `math`), so its input is
kept short enough to parse quickly."""


def extract_answer(reply: str) -> str:
    """The last `\\boxed{...}` (balanced braces) of `reply`, else its last non-empty line, stripped."""
    start = reply.rfind("\\boxed{")
    if start >= 0:
        depth, i = 0, start + len("\\boxed{")
        for j in range(i, len(reply)):
            if reply[j] == "{":
                depth += 1
            elif reply[j] == "}":
                if depth == 0:
                    return reply[i:j].strip()
                depth -= 1
    lines = [line.strip() for line in reply.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _normal(text: str) -> str:
    return " ".join(text.casefold().split())


def exact(answer: str, reference: str) -> bool:
    return _normal(answer) == _normal(reference)


def regex(answer: str, reference: str) -> bool:
    try:
        return re.fullmatch(reference, answer.strip()) is not None
    except re.error:
        return False


def _number(text: str) -> Fraction | None:
    try:
        return Fraction(text.strip().replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def math(answer: str, reference: str) -> bool:
    try:
        from math_verify import parse, verify
    except ImportError:
        a, r = _number(answer), _number(reference)
        return a is not None and a == r or exact(answer, reference)
    if len(answer) > MAX_MATH_CHARS or len(reference) > MAX_MATH_CHARS:
        return exact(answer, reference)
    try:  # no signal-based timeouts: they work only in a main thread, and both callers answer from threads
        gold = parse(reference, parsing_timeout=None)  # type: ignore[arg-type]  # None: no timeout (typed int)
        return bool(verify(gold, parse(answer, parsing_timeout=None), timeout_seconds=None))  # type: ignore[arg-type]
    except Exception:
        return False


CHECKERS: dict[str, Checker] = {"exact": exact, "regex": regex, "math": math}


def check(kind: str, reply: str, reference: str) -> bool:
    """Whether `reply` answers `reference` by checker `kind` (a key of CHECKERS)."""
    if kind not in CHECKERS:
        raise ValueError(f"unknown checker {kind!r}; known: {', '.join(CHECKERS)}")
    return CHECKERS[kind](extract_answer(reply), reference)
