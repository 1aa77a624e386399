#!/usr/bin/env bash
# One entry point on a fresh machine.
#   scripts/dev.sh build [KERNEL ...] [build.py flags]   set up, build every kernel for this
#                                                        machine and smoke-load each with kernels
#   scripts/dev.sh test  [pytest args]                   set up, build, run every test suite
#   scripts/dev.sh setup                                 only install what the project needs
# The virtual environment lives in .venv (override with VENV=...).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"

setup() {
  if [ ! -x "$PY" ]; then
    python3 -m venv "$VENV"
  fi
  "$PY" -m pip install -q --disable-pip-version-check -r requirements-dev.txt 2> >(grep -v "^WARNING: Location" >&2)
  # Nix 2.8 (Debian's nix-bin) for the offline flake checks; those tests skip without it.
  if ! command -v nix >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
      (apt-get update -qq && apt-get install -y -qq --no-install-recommends nix-bin >/dev/null) \
        || echo "warning: could not install nix-bin; the Nix tests will skip" >&2
    else
      echo "note: nix is not installed and cannot be installed here; the Nix tests will skip" >&2
    fi
  fi
}

cmd=${1:-help}
[ $# -gt 0 ] && shift
case "$cmd" in
  setup) setup ;;
  build)
    setup
    "$PY" scripts/build.py "$@"
    ;;
  test)
    setup
    "$PY" scripts/build.py --no-smoke
    kernel_tests=$(for d in */build.toml; do echo "${d%/build.toml}/tests"; done)
    # shellcheck disable=SC2086
    "$PY" -m pytest -q tests $kernel_tests "$@"
    ;;
  *)
    sed -n '2,8p' "$0"
    exit 2
    ;;
esac
