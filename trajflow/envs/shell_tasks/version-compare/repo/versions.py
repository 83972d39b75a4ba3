"""Comparing dotted version strings."""


def compare(a: str, b: str) -> int:
    """-1 if a < b, 0 if equal, 1 if a > b."""
    left, right = a.split("."), b.split(".")
    if left < right:
        return -1
    if left > right:
        return 1
    return 0


def newest(versions):
    best = versions[0]
    for v in versions[1:]:
        if compare(v, best) > 0:
            best = v
    return best
