"""The checks the task's verifier runs (`python3 check_inventory.py`: no test runner in the sandbox)."""

from inventory import restock

stock = {"apples": 3}
assert restock(stock, "apples", 2) == 5, stock
assert restock(stock, "pears", 4) == 4, stock
print("inventory checks pass")
