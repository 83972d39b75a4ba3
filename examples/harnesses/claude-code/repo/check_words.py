"""The checks the task's verifier runs (`python3 check_words.py`: no test runner in the sandbox)."""

from words import count_words

assert count_words("one two three") == 3
assert count_words("  spaced   out\ttext\n") == 3
assert count_words("") == 0
print("word checks pass")
