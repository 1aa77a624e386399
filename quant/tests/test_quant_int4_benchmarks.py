"""benchmarks/int4_sweep.py, checked without a GPU so that it cannot rot: its shapes and token
counts are the int4 issue's, its byte count is 4 bits a weight plus the group tables, and the
bars' verdicts follow the numbers. Timing and its verification need CUDA (the GPU run)."""

import pytest
from quant_sweeps import load_benchmark


@pytest.fixture
def sweep(monkeypatch):
    return load_benchmark(monkeypatch, "int4_sweep.py")


def test_cases_are_the_issues(sweep):
    shapes = {(c.k, c.n) for c in sweep.cases(False)}
    assert shapes == {(4096, 6144), (4096, 28672), (14336, 4096), (4096, 4096), (8192, 8192)}
    assert sorted({c.m for c in sweep.cases(False)}) == [1, 4, 16, 32, 64, 128, 256]
    assert set(sweep.cases(True)) <= set(sweep.cases(False))


def test_weight_bytes(sweep):
    case = sweep.Case("w4a16", "m", "l", 1, 256, 64)
    assert sweep.weight_bytes(case, False) == 256 * 64 // 2 + 2 * 2 * 64
    assert sweep.weight_bytes(case, True) == 256 * 64 // 2 + 2 * 2 * 2 * 64


def row(layer, m, speedup, copy_fraction):
    return {"layer": layer, "m": m, "speedup_vs_bf16": speedup, "copy_fraction": copy_fraction}


@pytest.mark.parametrize(
    "rows, expected",
    [
        (
            [
                row("gate_up", 1, 3.2, 0.85),
                row("down", 16, 3.1, 0.81),
                row("qkv", 64, 1.6, 0.5),
                row("o", 128, 1.0, 0.3),
            ],
            ["PASS", "PASS", "PASS", "PASS"],
        ),
        (
            [
                row("gate_up", 1, 2.9, 0.85),
                row("down", 4, 3.5, 0.79),
                row("qkv", 1, 1.0, 0.1),
                row("o", 64, 1.4, 0.3),
            ],
            ["FAIL", "FAIL", "FAIL", "NOT RUN"],
        ),
    ],
)
def test_bar_verdicts_follow_the_numbers(sweep, rows, expected):
    """The M <= 16 bars look only at gate_up and down (a slow qkv row does not fail them)."""
    assert [v["verdict"] for v in sweep.bar_verdicts(rows)] == expected
