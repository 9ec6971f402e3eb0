#!/usr/bin/env bash
# One-command set-up for a fresh clone, then the main job or the tests.
#   scripts/dev.sh run   -> .venv + every package, then `lightspec run --strategy hybrid` on the embedded model
#   scripts/dev.sh test  -> .venv + every package, then the whole test suite
#   scripts/dev.sh setup -> only the set-up
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

setup() {
  if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
  fi
  .venv/bin/python -m pip install -q --upgrade pip
  # the CPU build of torch (on this machine a local wheel); never let the resolver pick a CUDA build
  if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/pip install -q "torch==2.13.0"
  fi
  local plugins=()
  for p in plugins/*/; do [ -f "$p/pyproject.toml" ] && plugins+=(-e "$p"); done
  .venv/bin/pip install -q -e kernels -e "lightspec_core[serve,test]" -e zoo "${plugins[@]}" pytest
}

cmd=${1:-}
shift || true
case "$cmd" in
  setup) setup ;;
  run)
    setup
    exec .venv/bin/lightspec run --strategy hybrid --max-new-tokens 96 \
      --prompt "def fibonacci(n):" "$@" ;;
  test)
    setup
    exec .venv/bin/python -m pytest -q "$@" ;;
  *) echo "usage: scripts/dev.sh run|test|setup [extra args]" >&2; exit 2 ;;
esac
