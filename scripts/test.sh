#!/usr/bin/env bash
# `make test`'s checks after ruff and the docs build: two lanes side by side, one per core of a 2-core machine.
#
#   main lane (in front, its report as it goes): pytest in the main venv, every test outside tests/unit but those
#     marked `own_stack` or `harness`. These tests share the session's stack, Docker and sandboxes, and mostly wait.
#   beside lane (in the background, its report kept in .beside-tests.log and printed after the main lane's), one step
#     after another: pyright; tests/unit (CPU-bound, no stack of their own, a test cache of their own:
#     $TRAJFLOW_TEST_CACHE-unit, so the lanes never build one file at once); the tests marked `own_stack` (each starts
#     every server it uses in its own process, on free ports, without Docker); the tests marked `harness` (real agent
#     harnesses installed into their image layers, on a stack of their own); the vLLM engine's tests in .vllm-venv.
#
# Every step runs whatever the others' outcome; the script fails if any does, and pytest's exit code 5 ("no tests
# ran") is a failure in each. PYTEST_ARGS (the environment) is passed to every pytest of the main venv.
set -uo pipefail
USAGE="scripts/test.sh (make test runs it after the set-up, ruff and the docs build; PYTEST_ARGS=... to add options)"
case "${1:-}" in
  "") ;;
  -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; echo "Usage: $USAGE"; exit 0 ;;
  *) echo "make test: unknown option ${1} (usage: $USAGE)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
read -ra ARGS <<< "${PYTEST_ARGS:-}"
CACHE="${TRAJFLOW_TEST_CACHE:-$HOME/.cache/trajflow-tests}"
export TRAJFLOW_REQUIRE_VLLM=1
BESIDE_LOG=.beside-tests.log

# run "WHAT" CMD...: CMD's exit code, 5 (pytest: no tests ran) made 1 with a message; a line with its time after it
run() {
  local what=$1 start=$SECONDS code
  shift
  "$@"
  code=$?
  if [ "$code" = 5 ]; then
    echo "make test: $what ran no tests" >&2
    code=1
  fi
  echo "make test: $what exit $code in $((SECONDS - start)) s"
  return "$code"
}

beside() {
  local failed=0
  run "pyright" .venv/bin/pyright || failed=1
  TRAJFLOW_TEST_CACHE="$CACHE-unit" run "unit tests (tests/unit)" \
    .venv/bin/python -m pytest -ra "${ARGS[@]}" tests/unit || failed=1
  TRAJFLOW_TEST_CACHE="$CACHE-unit" run "own-stack tests (-m own_stack)" \
    .venv/bin/python -m pytest -ra "${ARGS[@]}" -m own_stack tests/integration || failed=1
  TRAJFLOW_TEST_CACHE="$CACHE-unit" run "harness tests (-m harness)" \
    .venv/bin/python -m pytest -ra "${ARGS[@]}" -m harness tests/integration || failed=1
  run "vLLM engine tests (.vllm-venv)" \
    .vllm-venv/bin/python -m pytest -ra -p no:cacheprovider tests/integration/test_vllm_engine.py || failed=1
  return "$failed"
}

echo "make test: pyright, tests/unit, the own-stack and harness tests and the vLLM engine's run beside the main tests" \
  "(their report follows)"
beside > "$BESIDE_LOG" 2>&1 &
beside_pid=$!
trap 'kill "$beside_pid" 2>/dev/null; pkill -P "$beside_pid" 2>/dev/null' INT TERM

run "main tests" .venv/bin/python -m pytest -ra "${ARGS[@]}" -m "not own_stack and not harness" --ignore=tests/unit
main=$?
wait "$beside_pid"
others=$?
echo "make test: the lane beside the main tests:"
cat "$BESIDE_LOG"
echo "make test: main tests exit $main; pyright, unit, own-stack, harness and vLLM engine tests (beside) exit $others"
[ "$main" = 0 ] && [ "$others" = 0 ]
