#!/usr/bin/env bash
# One-command set-up for a fresh clone, then the main job or the tests.
#   scripts/dev.sh run   -> .venv + every package, then `lightspec run --strategy hybrid` on the embedded model
#   scripts/dev.sh test  -> .venv + every package, then the whole test suite
#   scripts/dev.sh setup -> only the set-up
# `test` and `setup` also install chromium + chromedriver with apt when absent (the dashboard's browser tests)
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
  # [serve]: FastAPI + uvicorn (the server and its dashboard); [test]: openai, httpx, psutil, selenium
  .venv/bin/pip install -q -e kernels -e "lightspec_core[serve,test]" -e zoo "${plugins[@]}" pytest
}

browser() {
  # tests/test_dashboard_browser.py drives Debian's chromium (Playwright's own browser download needs the network)
  if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    return
  fi
  local sudo=()
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      echo "note: chromium/chromedriver are missing and apt-get needs root: the browser tests will be skipped" \
           "(under CI=true they fail)" >&2
      return
    fi
  fi
  if ! command -v apt-get >/dev/null; then
    echo "note: no apt-get here: install chromium and chromedriver for the browser tests" >&2
    return
  fi
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver
}

cmd=${1:-}
shift || true
case "$cmd" in
  setup) setup; browser ;;
  run)
    setup
    exec .venv/bin/lightspec run --strategy hybrid --max-new-tokens 96 \
      --prompt "def fibonacci(n):" "$@" ;;
  test)
    setup
    browser
    exec .venv/bin/python -m pytest -q "$@" ;;
  *) echo "usage: scripts/dev.sh run|test|setup [extra args]" >&2; exit 2 ;;
esac
