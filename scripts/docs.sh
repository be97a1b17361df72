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
  # Each snippet runs in one scratch folder, as a user would from a fresh directory: the
  # Python ones first (they write the runs the shell ones read), in name order. A Python
  # snippet whose first line is "# run: COMMAND" runs with that command (torchrun).
  local work=/tmp/layerscope-docs
  rm -rf "$work"
  mkdir -p "$work"
  ln -s "$repo/examples" "$work/examples"
  # One OpenMP thread per process: torchrun would otherwise print a warning that it set it.
  export PATH="$venv_bin:$PATH" PYTHONUNBUFFERED=1 WANDB_SILENT=true OMP_NUM_THREADS=1
  for snippet in docs/snippets/*.py; do
    local name command
    name=$(basename "$snippet" .py)
    command="python"
    if head -1 "$snippet" | grep -q '^# run: '; then
      command=$(head -1 "$snippet" | sed 's/^# run: //')
    fi
    echo "docs: $command $snippet" >&2
    (cd "$work" && $command "$repo/$snippet") >"docs/snippets/$name.out" 2>&1
  done
  # Shell snippets: each line a command, shown as "$ command" and followed by its output.
  for snippet in docs/snippets/*.sh; do
    local name
    name=$(basename "$snippet" .sh)
    echo "docs: $snippet" >&2
    : >"docs/snippets/$name.out"
    while IFS= read -r line; do
      case "$line" in '' | '#'*) continue ;; esac
      echo "\$ $line" >>"docs/snippets/$name.out"
      (cd "$work" && bash -c "$line") >>"docs/snippets/$name.out" 2>&1
    done <"$snippet"
  done
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
