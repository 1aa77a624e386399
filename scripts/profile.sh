#!/usr/bin/env bash
# Profile a kernel of this repository, or an end-to-end model run, on a GPU.
#   scripts/profile.sh ncu KERNEL OP [sizes] [--set S] [--kernel-regex RE] ...   Nsight Compute
#   scripts/profile.sh nsys KERNEL OP [sizes]  |  nsys e2e --model M [e2e args]  Nsight Systems
#   scripts/profile.sh trace KERNEL OP [sizes] |  trace e2e --model M [e2e args] torch profiler
#   scripts/profile.sh families TRACE.json|KERN_SUM.csv     GPU time per op family, again
#   scripts/profile.sh --help  |  scripts/profile.sh MODE --help
# Reports go to profiles/<UTC time>/ (git-ignored) or --reports DIR; the folder is printed.
# The work is done by scripts/profile_tools.py (argument parsing, the op driver, the tables).
# Python: $PY, default python3 (on a GPU machine, the one with CUDA PyTorch and `kernels`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
if [ $# -eq 0 ]; then
  set -- --help
fi
exec "$PY" scripts/profile_tools.py "$@"
