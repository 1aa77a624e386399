#!/usr/bin/env bash
# Everything a GPU session checks, in one call (build for the local GPU, GPU tests under the
# loader, compute-sanitizer, benchmarks). Logs and result files go to $OUT (default /tmp/gpu-out).
#   scripts/gpu_check.sh [KERNEL ...]        default: every kernel folder
# Env: CUDA_ARCHS (default: the local GPU's; e.g. 9.0a), SKIP_BENCH=1, PYTEST_ARGS, SWEEP_ARGS,
# GPU_CXX (host compiler; on the lent H100/H200 image use /usr/bin/g++: extensions linked by its
# default CXX wrapper, /opt/gcc/bin/g++, crash when a C++ exception is thrown).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
kernels_list=("$@")
if [ ${#kernels_list[@]} -eq 0 ]; then
  for d in */build.toml; do kernels_list+=("${d%/build.toml}"); done
fi
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee "$OUT/device.txt"
arch_flag=()
[ -n "${CUDA_ARCHS:-}" ] && arch_flag=(--cuda-archs "$CUDA_ARCHS")
# Without .git (a copied tree) name the ops id and the commit: UNIQUE_ID, KERNELS_COMMIT.
[ -n "${UNIQUE_ID:-}" ] && arch_flag+=(--unique-id "$UNIQUE_ID")
CXX=${GPU_CXX:-${CXX:-c++}} $PY scripts/build.py "${kernels_list[@]}" --backend cuda "${arch_flag[@]}" 2>&1 | tee "$OUT/build.log" \
  || { echo "BUILD FAILED"; exit 1; }
for k in "${kernels_list[@]}"; do
  # shellcheck disable=SC2086
  $PY -m pytest "$k/tests" -q -rs ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/tests-$k.log" || status=1
  if [ -f "$k/tests/sanitize.py" ] && command -v compute-sanitizer >/dev/null; then
    for tool in memcheck racecheck; do
      # racecheck takes the script's --small set where it has one (see its docstring)
      extra=()
      if [ "$tool" = racecheck ] && grep -q -- '"--small"' "$k/tests/sanitize.py"; then extra=(--small); fi
      compute-sanitizer --tool "$tool" --error-exitcode 9 $PY "$k/tests/sanitize.py" "${extra[@]}" \
        2>&1 | tail -n 20 | tee "$OUT/sanitizer-$tool-$k.log" || status=1
    done
  fi
  if [ -z "${SKIP_BENCH:-}" ] && [ -f "$k/benchmarks/sweep.py" ]; then
    $PY "$k/benchmarks/sweep.py" ${SWEEP_ARGS:-} --out "$OUT/bench-$k.json" 2>&1 | tee "$OUT/sweep-$k.log" || status=1
    # kernels.cli imports its signature verifier (sigstore, cryptography), absent on the GPU
    # image and not needed to benchmark: stand it in.
    $PY -c "import sys, types; m = types.ModuleType('kernels.cli.verify_signature'); m.verify_signature = None; sys.modules[m.__name__] = m; from kernels.cli import main; sys.argv[0] = 'kernels'; main()" benchmark "$k" --iterations 50 --warmup 10 --output "$OUT/kernels-benchmark-$k.json" \
      > "$OUT/kernels-benchmark-$k.log" 2>&1 || { echo "kernels benchmark failed for $k"; tail "$OUT/kernels-benchmark-$k.log"; status=1; }
  fi
done
exit $status
