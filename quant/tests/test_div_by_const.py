"""quant_math.h's div_by_const (the division by a per-row / group / tensor scale of the CUDA
kernels, at FMA cost) is the IEEE division bit for bit: div_by_const_check.cpp compares the two
over every bfloat16 and float16 dividend, every float32 mantissa of a binade, random and special
values, against the scales the ops compute and the edges of the fast range; it also checks the
32-bit zero point add of the int8 kernels (add_azp_sat) against the rule. It is host C++,
built here with the system compiler (-ffp-contract=off, so fmaf is the only FMA); no GPU needed.
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


def build(tmp_path_factory, *defines):
    cxx = compiler()
    if cxx is None:
        pytest.skip("no C++ compiler (set CXX)")
    exe = tmp_path_factory.mktemp("div_by_const") / "div_by_const_check"
    cmd = [cxx, "-std=c++17", "-O2", "-ffp-contract=off", f"-I{KERNEL_SRC}"]
    cmd += [f"-D{d}" for d in defines]
    cmd += [str(TESTS / "div_by_const_check.cpp"), "-o", str(exe)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return exe


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    return build(tmp_path_factory)


def run(exe, *args):
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.mark.kernels_ci
def test_div_by_const_is_ieee_division(checker):
    # Defaults: 40 random scales of each kind, 2M random pairs, 4 exhaustive binades (~1 s). A
    # mismatch prints its operands.
    proc = run(checker)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 mismatches" in proc.stdout, proc.stdout


@pytest.mark.kernels_ci
def test_checker_sees_one_ulp(tmp_path_factory):
    """The same check on the uncorrected quotient RN(x * RN(1/s)) must report mismatches."""
    naive = build(tmp_path_factory, "CHECK_NAIVE_RECIPROCAL")
    proc = run(naive, 10, 10000, 1)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "MISMATCH" in proc.stdout
