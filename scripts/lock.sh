#!/usr/bin/env bash
# Regenerate the lock files from pyproject.toml (`make lock`): pip-tools' pip-compile with sha256 hashes, in a venv
# of its own (.lock-venv). requirements/dev.txt (every extra and the test tools: `make setup-test`, CI) is compiled
# first; requirements/all.txt (every role: `make setup`, `make demo`) and requirements/base.txt (a plain
# `pip install trajflow`: tests/integration/test_base_install.py) start from its pins, so the three agree.
# Pins already in a lock are kept (pip-compile prefers them); to move one: scripts/lock.sh --upgrade-package NAME.
# torch is constrained to 2.13.0 (requirements/torch.txt): pip then takes the CPU wheel its find-links point at
# (torch==2.13.0+cpu, hashed as that file) and never resolves a CUDA build. Takes ~5 min keeping the pins, ~15 from none.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.lock-venv
[ -x "$VENV/bin/pip-compile" ] || { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q pip-tools==7.6.2; }
compile() {  # compile OUT [--extra NAME] [pip-compile options...]
  local out=$1; shift
  CUSTOM_COMPILE_COMMAND="make lock" "$VENV/bin/pip-compile" -q --generate-hashes --strip-extras \
    --unsafe-package trajflow --no-emit-find-links --no-emit-index-url -c requirements/torch.txt \
    -o "$out" "$@" pyproject.toml
}
# `trajflow[all]` inside the extras makes pip-compile list the project itself (unhashed): --unsafe-package
# trajflow leaves it as a comment, and setuptools, which some packages need at run time, is pinned like the rest.
compile requirements/dev.txt --extra dev "$@"
cp requirements/dev.txt requirements/all.txt
cp requirements/dev.txt requirements/base.txt
compile requirements/all.txt --extra all & all=$!
compile requirements/base.txt & base=$!
wait "$all"
wait "$base"
echo "lock: requirements/dev.txt, all.txt and base.txt regenerated"
