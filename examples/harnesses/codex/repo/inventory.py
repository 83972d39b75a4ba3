"""A tiny stock keeper."""


def restock(stock, item, count):
    """Add `count` units of `item` to `stock` (a dict of item -> units) and return the new total for it."""
    stock[item] = stock.get(item, 0) - count
    return stock[item]
