python3 - <<'PY'
src = open("stats.py").read()
src = src.replace("""    values.sort()
    middle = len(values) // 2
    return values[middle]""", """    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2""")
open("stats.py", "w").write(src)
PY
