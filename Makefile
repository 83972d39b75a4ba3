# The two commands of the quick start. Both set up (idempotently) and reuse .venv.
.PHONY: demo test setup setup-test down

demo: setup
	.venv/bin/trajflow up
	.venv/bin/trajflow demo

# pytest's exit code 5 ("no tests ran") is turned into a loud failure, never mistaken for success.
test: setup-test
	.venv/bin/python -m pytest -ra $(PYTEST_ARGS); code=$$?; \
	if [ $$code = 5 ]; then echo "make test: pytest ran no tests" >&2; exit 1; fi; exit $$code

setup:
	scripts/bootstrap.sh

setup-test:
	scripts/bootstrap.sh --test

down:
	.venv/bin/trajflow down
