"""Small text helpers."""

import unicodedata


def slugify(title: str) -> str:
    """A URL slug: lowercase ASCII words joined by single hyphens."""
    ascii_title = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    out = []
    for ch in ascii_title.lower():
        out.append(ch if ch.isalnum() else "-")
    return "".join(out)
