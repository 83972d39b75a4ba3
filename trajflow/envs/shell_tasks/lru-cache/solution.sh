python3 - <<'PY'
src = open("lru.py").read()
src = src.replace("            return default\n        return self._items[key]", "            return default\n        self._items.move_to_end(key)\n        return self._items[key]")
src = src.replace("            self._items[key] = value\n            return", "            self._items[key] = value\n            self._items.move_to_end(key)\n            return")
open("lru.py", "w").write(src)
PY
