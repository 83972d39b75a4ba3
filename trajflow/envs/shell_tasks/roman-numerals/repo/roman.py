"""Integers <-> Roman numerals (1..3999)."""

_VALUES = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]
_SYMBOLS = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(number: int) -> str:
    if not 0 < number < 4000:
        raise ValueError(f"out of range: {number}")
    out = []
    for value, symbol in _VALUES:
        count, number = divmod(number, value)
        out.append(symbol * count)
    return "".join(out)


def from_roman(text: str) -> int:
    if not text or any(ch not in _SYMBOLS for ch in text):
        raise ValueError(f"not a Roman numeral: {text!r}")
    return sum(_SYMBOLS[ch] for ch in text)
