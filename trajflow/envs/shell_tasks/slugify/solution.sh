python3 - <<'PY'
src = open("text.py").read()
src = src.replace('    return "".join(out)', '    return "-".join(part for part in "".join(out).split("-") if part)')
open("text.py", "w").write(src)
PY
