"""Word statistics for short texts."""


def count_words(text):
    """The number of words in `text`, however many spaces, tabs or newlines separate them."""
    return len(text.split(" "))
