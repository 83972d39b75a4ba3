"""A least-recently-used cache with a fixed capacity."""

from collections import OrderedDict


class LRUCache:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._items: OrderedDict = OrderedDict()

    def get(self, key, default=None):
        if key not in self._items:
            return default
        return self._items[key]

    def put(self, key, value) -> None:
        if key in self._items:
            self._items[key] = value
            return
        if len(self._items) >= self.capacity:
            self._items.popitem(last=False)
        self._items[key] = value

    def __len__(self) -> int:
        return len(self._items)
