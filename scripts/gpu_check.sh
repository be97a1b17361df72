#!/usr/bin/env bash
# What only a CUDA GPU can confirm of the GPU path, in one command (about 8 minutes):
#   1. the Triton kernels compiled and run there, every dtype and histogram against float64
#      (tests/stats/test_triton.py runs on CUDA where there is one);
#   2. the tests marked cuda: no host sync in a recorded or a sentinel step, token ids and the
#      optimizer's step included, nested scopes;
#   3. benchmarks/gpu.py: step-time ratios of every configuration on GPT-2, ResNet-50 and the
#      launch-bound stack, host syncs per configuration, exactness against float64.
# Usage: bash scripts/gpu_check.sh [OUT]   (gpu.json goes to OUT, default the current folder;
# GPU_BUDGET, default 360, is benchmarks/gpu.py's --budget in seconds.)
set -euo pipefail
out="$(realpath "${1:-.}")"
cd "$(dirname "$0")/.."
python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device here')"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # where layerscope is not installed
python3 -m pytest -q -p no:cacheprovider tests/stats/test_triton.py
python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_safety.py tests/test_nested.py
python3 benchmarks/gpu.py --budget "${GPU_BUDGET:-360}" --json "$out/gpu.json"
