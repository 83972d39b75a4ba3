python3 - <<'PY'
import re
src = open("roman.py").read()
src = src.replace('    return sum(_SYMBOLS[ch] for ch in text)\n', '''    total = 0
    for ch, nxt in zip(text, text[1:] + " "):
        value = _SYMBOLS[ch]
        total += -value if nxt != " " and _SYMBOLS[nxt] > value else value
    return total
''')
open("roman.py", "w").write(src)
PY
