#!/usr/bin/env bash
# Install layerscope and its development tools into .venv, then lint, type-check and test.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
source scripts/torch.sh
install_torch  # first: with no torch installed, a plain `torch` requirement pulls the CUDA build
# No bytecode compiled up front: the tests import a small part of what the tools bring.
.venv/bin/pip install -q --no-compile -e '.[dev]'
# The dashboard's browser tests drive Debian's chromium (Playwright's own download is not used).
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } ||
    echo "chromium could not be installed: the browser tests will be skipped" >&2
fi
.venv/bin/ruff check src tests examples benchmarks
.venv/bin/ruff format --check src tests examples benchmarks
.venv/bin/mypy
status=0
# Two worker processes, a test file each at a time: the suite's subprocesses and compiles
# leave a second core idle otherwise.
.venv/bin/python -m pytest -n 2 --dist loadfile "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests" >&2
fi
exit "$status"
