#!/usr/bin/env bash
# Build the documentation site strictly (any mkdocs or mkdocstrings warning fails the build).
#
#   bash scripts/docs.sh             build into build/site/
#   bash scripts/docs.sh --outputs   first run every snippet the pages show, rewriting the
#                                    outputs they show (docs/snippets/*.out), then build
#   bash scripts/docs.sh --serve     serve the site on 127.0.0.1:8000 while editing
#
# Needs: pip install -e '.[docs]' (the outputs also need '.[all]' and accelerate).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
venv_bin="$repo/.venv/bin"
if [ ! -x "$venv_bin/mkdocs" ]; then
  if ! command -v mkdocs >/dev/null; then
    echo "mkdocs is not installed: pip install -e '.[docs]'" >&2
    exit 1
  fi
  venv_bin=$(dirname "$(command -v mkdocs)")
fi

run_snippets() {
  # scripts/run_snippets.py runs every snippet in one scratch folder and rewrites its output;
  # "python" is the one beside mkdocs, as are the layerscope and torchrun the snippets call.
  local work=/tmp/layerscope-docs
  PATH="$venv_bin:$PATH" python scripts/run_snippets.py --work "$work"
  # The figures of the demo's runs, shown in guides/dying-activations.md.
  for recipe in broken fixed; do
    for figure in dead_chart color_dim-activation; do
      cp "$work/layerscope-demo/$recipe/plots/$figure.png" "docs/guides/images/demo-$recipe-$figure.png"
    done
  done
}

case "${1:-}" in
  --outputs)
    run_snippets
    ;;
  --serve)
    exec "$venv_bin/mkdocs" serve --strict
    ;;
  "") ;;
  *)
    echo "usage: scripts/docs.sh [--outputs | --serve]" >&2
    exit 2
    ;;
esac
"$venv_bin/mkdocs" build --strict
