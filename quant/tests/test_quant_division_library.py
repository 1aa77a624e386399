"""quant_math.h's div_by_const (the division by a per-row / group / tensor scale of the CUDA
kernels, at FMA cost) is the IEEE division bit for bit, and div_by_const_bounded (the same
without the per-element test, for rows and groups whose quotients are known to be in range)
gives the same quantized values: div_by_const_check.cpp compares them over every bfloat16 and
float16 dividend, every float32 mantissa of a binade, random and special values, against the
scales the ops compute and the edges of the fast range; it also checks the 32-bit zero point
add of the int8 kernels (add_azp_sat) against the rule. It is host C++, built here with the
system compiler (-ffp-contract=off, so fmaf is the only FMA); no GPU needed.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
KERNEL_SRC = TESTS.parent / "kernel_src"


def compiler():
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")


@pytest.fixture(scope="module")
def checkers(tmp_path_factory):
    """The checker, and its CHECK_NAIVE_RECIPROCAL build, compiled side by side."""
    cxx = compiler()
    if cxx is None:
        pytest.skip("no C++ compiler (set CXX)")
    folder = tmp_path_factory.mktemp("div_by_const")
    builds = {}
    for name, defines in (("exact", []), ("naive", ["-DCHECK_NAIVE_RECIPROCAL"])):
        exe = folder / f"div_by_const_check_{name}"
        cmd = [cxx, "-std=c++17", "-O2", "-ffp-contract=off", f"-I{KERNEL_SRC}", *defines]
        cmd += [str(TESTS / "div_by_const_check.cpp"), "-o", str(exe)]
        builds[name] = (exe, subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True))
    for name, (exe, proc) in builds.items():
        _, err = proc.communicate()
        assert proc.returncode == 0, f"{name} build failed:\n{err}"
    return {name: exe for name, (exe, _) in builds.items()}


def run(exe, *args):
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.mark.kernels_ci
def test_div_by_const_is_ieee_division(checkers):
    # Defaults: 40 random scales of each kind, 2M random pairs, 4 exhaustive binades (~1 s). A
    # mismatch prints its operands.
    proc = run(checkers["exact"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 mismatches" in proc.stdout, proc.stdout


@pytest.mark.kernels_ci
def test_checker_sees_one_ulp(checkers):
    """The same check on the uncorrected quotient RN(x * RN(1/s)) must report mismatches."""
    proc = run(checkers["naive"], 10, 10000, 1)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "MISMATCH" in proc.stdout
