"""Summary statistics without numpy."""


def mean(values):
    if not values:
        raise ValueError("mean of no values")
    return sum(values) / len(values)


def median(values):
    if not values:
        raise ValueError("median of no values")
    values.sort()
    middle = len(values) // 2
    return values[middle]
