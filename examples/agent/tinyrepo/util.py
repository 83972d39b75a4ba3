"""Helpers of tinyrepo (the example agent's repository: its questions are about these files)."""


def slugify(text: str) -> str:
    return "-".join(text.lower().split())


def parse_tags(text: str) -> list[str]:
    return [tag.strip() for tag in text.split(",") if tag.strip()]


def clamp(value: int, low: int, high: int) -> int:
    return max(low, min(value, high))
