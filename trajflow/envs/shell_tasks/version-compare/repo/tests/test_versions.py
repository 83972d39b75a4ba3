import unittest

from versions import compare, newest


class CompareTest(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(compare("1.2", "1.3"), -1)
        self.assertEqual(compare("2.0", "1.9"), 1)
        self.assertEqual(compare("1.2.3", "1.2.3"), 0)

    def test_numeric_parts(self):
        self.assertEqual(compare("1.10", "1.9"), 1)
        self.assertEqual(compare("1.9.9", "1.10"), -1)

    def test_missing_parts_are_zero(self):
        self.assertEqual(compare("1.0", "1"), 0)
        self.assertEqual(compare("1.0.1", "1"), 1)

    def test_newest(self):
        self.assertEqual(newest(["1.9", "1.10", "1.2"]), "1.10")


if __name__ == "__main__":
    unittest.main()
