import unittest

from intervals import merge


class MergeTest(unittest.TestCase):
    def test_sorted_input(self):
        self.assertEqual(merge([(1, 3), (2, 6), (8, 10)]), [(1, 6), (8, 10)])

    def test_touching(self):
        self.assertEqual(merge([(1, 4), (4, 5)]), [(1, 5)])

    def test_unsorted_input(self):
        self.assertEqual(merge([(8, 10), (1, 3), (2, 6)]), [(1, 6), (8, 10)])
        self.assertEqual(merge([(5, 7), (1, 2), (2, 5)]), [(1, 7)])

    def test_empty(self):
        self.assertEqual(merge([]), [])

    def test_rejects_reversed(self):
        with self.assertRaises(ValueError):
            merge([(3, 1)])


if __name__ == "__main__":
    unittest.main()
