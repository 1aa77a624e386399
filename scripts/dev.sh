#!/usr/bin/env bash
# One entry point on a fresh machine.
#   scripts/dev.sh build [KERNEL ...] [build.py flags]   set up, build every kernel for this
#                                                        machine and smoke-load each with kernels
#   scripts/dev.sh test  [pytest args]                   set up, build, run every test suite
#   scripts/dev.sh lint                                  fail on unformatted or unlinted code
#   scripts/dev.sh format                                apply ruff and clang-format in place
#   scripts/dev.sh compile-check [compile_check.py args] compile every kernel_src .cu for sm_90a
#   scripts/dev.sh setup                                 only install the Python packages
#   scripts/dev.sh help                                  this text
# The virtual environment lives in .venv (override with VENV=...). Only `test` installs Nix (for
# the offline flake checks); building needs no Nix.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

step() {
  echo "==> $*"
}

setup() {
  if [ ! -x "$PY" ]; then
    step "creating the virtual environment $VENV"
    python3 -m venv "$VENV"
  fi
  # pip prints a line per package it collects or installs: a first install takes minutes on two
  # cores and must not look hung. Packages already present are not listed.
  step "installing requirements-dev.txt into $VENV (the first time takes several minutes)"
  "$PY" -m pip install --disable-pip-version-check --progress-bar off -r requirements-dev.txt \
    > >(grep -v "^Requirement already satisfied" || true) 2> >(grep -v "^WARNING: Location" >&2)
  step "Python packages ready"
}

setup_nix() {
  # Nix 2.8 (Debian's nix-bin) for the offline flake checks; those tests skip without it.
  command -v nix >/dev/null 2>&1 && return
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    step "installing Debian's nix-bin: the tests check every flake offline (a build does not need it)"
    (apt-get update -qq && apt-get install -y -qq --no-install-recommends nix-bin >/dev/null) \
      || echo "warning: could not install nix-bin; the Nix tests will skip" >&2
  else
    echo "note: nix is not installed and cannot be installed here; the Nix tests will skip" >&2
  fi
}

# The C++/CUDA files under version control (clang-format's input).
cxx_files() {
  git ls-files -- '*.cu' '*.cuh' '*.cpp' '*.h' '*.hpp' '*.cc'
}

cmd=${1:-help}
[ $# -gt 0 ] && shift
case "$cmd" in
  setup) setup ;;
  build)
    setup
    "$PY" scripts/build.py "$@"
    ;;
  lint)
    setup
    "$VENV/bin/ruff" format --check .
    "$VENV/bin/ruff" check .
    cxx_files | xargs "$VENV/bin/clang-format" --style=file --dry-run -Werror
    echo "lint: ruff and clang-format clean"
    ;;
  format)
    setup
    "$VENV/bin/ruff" check --fix .
    "$VENV/bin/ruff" format .
    cxx_files | xargs "$VENV/bin/clang-format" --style=file -i
    ;;
  compile-check)
    setup
    "$PY" scripts/compile_check.py "$@"
    ;;
  test)
    setup
    setup_nix
    step "building every kernel"
    "$PY" scripts/build.py --no-smoke
    kernel_tests=$(for d in */build.toml; do echo "${d%/build.toml}/tests"; done)
    # shellcheck disable=SC2086
    "$PY" -m pytest -q tests $kernel_tests "$@"
    ;;
  help | -h | --help)
    usage
    ;;
  *)
    echo "unknown command: $cmd" >&2
    usage >&2
    exit 2
    ;;
esac
