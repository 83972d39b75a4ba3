"""The checks the task's verifier runs (`python3 test_calc.py`: no test runner in the sandbox)."""

from calc import average, spread


def test_average():
    assert average([2, 4, 6]) == 4
    assert average([5]) == 5


def test_spread():
    assert spread([3, 9, 4]) == 6


if __name__ == "__main__":
    test_average()
    test_spread()
    print("all tests pass")
