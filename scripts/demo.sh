#!/usr/bin/env bash
# Install layerscope into .venv, then train a small CNN on digits broken and fixed, watched.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
source scripts/torch.sh
install_torch  # first: with no torch installed, a plain `torch` requirement pulls the CUDA build
.venv/bin/pip install -q -e '.[demo]'
.venv/bin/layerscope demo "$@"
# A new shell does not have the venv on its PATH.
echo "layerscope is installed in .venv: run the commands above as .venv/bin/layerscope ...," \
  "or first: source .venv/bin/activate"
