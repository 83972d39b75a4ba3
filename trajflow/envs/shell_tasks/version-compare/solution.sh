python3 - <<'PY'
src = open("versions.py").read()
src = src.replace('''    left, right = a.split("."), b.split(".")''', '''    left, right = [int(p) for p in a.split(".")], [int(p) for p in b.split(".")]
    width = max(len(left), len(right))
    left, right = left + [0] * (width - len(left)), right + [0] * (width - len(right))''')
open("versions.py", "w").write(src)
PY
