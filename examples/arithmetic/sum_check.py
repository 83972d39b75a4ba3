"""This example's own verifier for chain_sum (`env_kwargs = { verifier = "sum_check:check" }`): the reply's last
`\\boxed{...}` must hold the sum as an integer (thousands separators and a trailing ".0" allowed). A reply without a
boxed integer scores -0.1, below a wrong answer in the right form, as GEM's format penalty does. It runs in the
task's sandbox, stdlib only (a requirements.txt beside it would be installed there)."""

import re

_BOXED = re.compile(r"\\boxed\{\s*([-+]?[\d,]+)(?:\.0+)?\s*\}")


def check(response: str, reference: str) -> float:
    found = _BOXED.findall(response)
    if not found:
        return -0.1
    return 1.0 if int(found[-1].replace(",", "")) == int(reference) else 0.0
