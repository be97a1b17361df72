#!/usr/bin/env bash
# Install layerscope and its development tools into .venv, then lint, type-check and test.
set -euo pipefail
cd "$(dirname "$0")/.."
# The dashboard's browser tests drive Debian's chromium (Playwright's own download is not used):
# installed beside the Python packages, which do not need it.
chromium=""
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null; then
  {
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } ||
      echo "chromium could not be installed: the browser tests will be skipped" >&2
  } &
  chromium=$!
fi
# Bytecode is written as modules are first imported, once: a machine that says not to
# (PYTHONDONTWRITEBYTECODE) would have each of the tests' hundreds of Python processes compile
# torch, pandas and the rest from source again, which doubles the suite's time.
unset PYTHONDONTWRITEBYTECODE
python3 -m venv .venv
source scripts/torch.sh
install_torch  # first: with no torch installed, a plain `torch` requirement pulls the CUDA build
# No bytecode compiled up front: the tests import a small part of what the tools bring.
.venv/bin/pip install -q --no-compile -e '.[dev]'
if [ -n "$chromium" ]; then
  wait "$chromium" || true
fi
.venv/bin/ruff check src tests examples benchmarks
.venv/bin/ruff format --check src tests examples benchmarks
# mypy (a minute on one core, from cold) checks beside the tests, whose start and subprocesses
# leave a core free at times; its verdict counts as the tests' does, and is printed after them.
mypy_log=$(mktemp)
.venv/bin/mypy >"$mypy_log" 2>&1 &
mypy=$!
status=0
# Two worker processes, a test file each at a time: the suite's subprocesses and compiles
# leave a second core idle otherwise.
# The slowest tests listed at the end: what to look at first when the run grows.
.venv/bin/python -m pytest -n 2 --dist loadfile --durations=25 "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests" >&2
fi
mypy_status=0
wait "$mypy" || mypy_status=$?
cat "$mypy_log"
rm -f "$mypy_log"
if [ "$mypy_status" -ne 0 ]; then
  echo "mypy failed" >&2
  [ "$status" -ne 0 ] || status=$mypy_status
fi
exit "$status"
