"""Merging closed integer intervals given as (start, end) pairs."""


def merge(intervals):
    """Merge overlapping or touching intervals; the result is sorted by start."""
    merged = []
    for start, end in intervals:
        if start > end:
            raise ValueError(f"empty interval: {(start, end)}")
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
