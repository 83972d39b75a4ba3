import unittest

from roman import from_roman, to_roman


class RomanTest(unittest.TestCase):
    def test_to_roman(self):
        self.assertEqual(to_roman(4), "IV")
        self.assertEqual(to_roman(1994), "MCMXCIV")
        self.assertEqual(to_roman(3888), "MMMDCCCLXXXVIII")

    def test_from_roman_additive(self):
        self.assertEqual(from_roman("VIII"), 8)
        self.assertEqual(from_roman("MMXXV"), 2025)

    def test_from_roman_subtractive(self):
        self.assertEqual(from_roman("IV"), 4)
        self.assertEqual(from_roman("XC"), 90)
        self.assertEqual(from_roman("MCMXCIV"), 1994)

    def test_round_trip(self):
        for n in range(1, 4000):
            self.assertEqual(from_roman(to_roman(n)), n)

    def test_rejects_garbage(self):
        with self.assertRaises(ValueError):
            from_roman("ABC")


if __name__ == "__main__":
    unittest.main()
