"""Factor a quadratic over the integers, in up to three attempts: a small multi-turn env packaged as a trajflow user
env (`py:factor_env:FactorEnv`, this directory as its `env_path`, sympy from requirements.txt).

Each episode (fixed by its seed) asks for the factored form of (a·x + b)(c·x + d) expanded, e.g. 2*x**2 + 5*x - 3.
The agent answers inside \\boxed{...}. A right answer (a product of non-constant factors that expands to the target)
ends the episode with reward 1.0; a wrong one gets feedback (what it expands to) and reward 0.0 while attempts are
left; an answer that is missing or is not a polynomial in x costs 0.1. The env knows nothing of trajflow: the
GEM/gymnasium interface, strings in and out.
"""

from __future__ import annotations

import random
import re
from typing import Any

import sympy

X = sympy.Symbol("x")
ALLOWED = re.compile(r"[0-9x+\-*/^() ]+")
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
MALFORMED = -0.1


def _safe_powers(text: str) -> bool:
    """Powers only of x or of a parenthesis, by one digit, never of a power: no answer can take long to expand."""
    for power in re.finditer(r"\*\*", text):
        before, after = text[: power.start()].rstrip(), text[power.end() :].lstrip()
        if not before or before[-1] not in "x)" or not re.match(r"\d(?!\s*\d)(?!\s*\*\*)", after):
            return False
    return True


def _nonzero(rng: random.Random, low: int, high: int) -> int:
    return rng.choice([n for n in range(low, high + 1) if n != 0])


class FactorEnv:
    def __init__(self, max_attempts: int = 3, max_leading: int = 3, max_constant: int = 9) -> None:
        self.max_attempts = max_attempts
        self.max_leading = max_leading
        self.max_constant = max_constant
        self.target: sympy.Expr = sympy.Integer(0)
        self.attempts = 0

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        rng = random.Random(seed)
        a, c = rng.randint(1, self.max_leading), rng.randint(1, self.max_leading)
        b, d = (
            _nonzero(rng, -self.max_constant, self.max_constant),
            _nonzero(rng, -self.max_constant, self.max_constant),
        )
        self.target = sympy.expand((a * X + b) * (c * X + d))
        self.attempts = 0
        text = (
            f"Factor the polynomial {sympy.sstr(self.target)} over the integers.\n"
            "Write the factored form inside \\boxed{...}, using x, integers, +, -, * and parentheses, "
            f"for example \\boxed{{(2*x - 1)*(x + 3)}}. You have {self.max_attempts} attempts."
        )
        return text, {"target": sympy.sstr(self.target)}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.attempts += 1
        left = self.max_attempts - self.attempts
        out_of_attempts = left <= 0
        answer = self._parse(action)
        if answer is None:
            note = "Answer inside \\boxed{...} with a polynomial in x, e.g. \\boxed{(2*x - 1)*(x + 3)}."
            return self._feedback(f"I could not read an answer. {note}", MALFORMED, out_of_attempts, left)
        if sympy.expand(answer - self.target) == 0 and self._is_factored(answer):
            return "Correct!", 1.0, True, False, {"solved": True, "attempts": self.attempts}
        if sympy.expand(answer - self.target) == 0:
            note = "That is the same polynomial, but not factored into a product."
        else:
            note = f"{sympy.sstr(answer)} expands to {sympy.sstr(sympy.expand(answer))}, not the target."
        return self._feedback(note, 0.0, out_of_attempts, left)

    def _feedback(
        self, note: str, reward: float, done: bool, left: int
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if done:
            text = f"{note} The answer was {sympy.sstr(sympy.factor(self.target))}."
        else:
            text = f"{note} {left} attempt(s) left."
        return text, reward, done, False, {"solved": False, "attempts": self.attempts}

    @staticmethod
    def _parse(action: str) -> sympy.Expr | None:
        """The last boxed answer as a polynomial in x, or None. Only digits, x, + - * / ^ and parentheses, and
        powers of x or of a parenthesis by one digit, so that no answer can take long to expand."""
        found = BOXED.findall(action)
        if not found:
            return None
        text = found[-1].replace("^", "**")
        if len(text) > 100 or not ALLOWED.fullmatch(text) or not _safe_powers(text):
            return None
        try:
            expr = sympy.sympify(text)  # only x, digits and operators reach here: x is Symbol("x")
        except (sympy.SympifyError, SyntaxError, TypeError, ZeroDivisionError):
            return None
        if not isinstance(expr, sympy.Expr) or expr.free_symbols - {X} or not expr.is_polynomial(X):
            return None
        return expr

    @staticmethod
    def _is_factored(expr: sympy.Expr) -> bool:
        """A product of at least two non-constant factors (a square counts as two)."""
        factors = [f for f in sympy.Mul.make_args(expr) if f.has(X)]
        return sum(int(f.exp) if isinstance(f, sympy.Pow) else 1 for f in factors) >= 2
