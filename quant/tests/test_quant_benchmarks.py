"""The benchmark scripts, checked without a GPU: benchmark.py's workloads run as `kernels
benchmark` runs them (setup, one call, verify, the runner's allclose with atol=1e-2) on the
`kernel` fixture's device, and sweep.py's eager baselines compute exactly what our ops compute
(bit for bit), so the timed contenders do the same work as ours."""

from pathlib import Path

import pytest
import torch
from quant_fixture import benchmark_fixtures, benchmark_workloads
from test_quant_ops import assert_bitwise, fp8_capable

BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"

bench, sweep = benchmark_fixtures("quant", BENCH_DIR)


@pytest.fixture
def fp8_device(device):
    if not fp8_capable(device):
        pytest.skip("float8_e4m3fn needs compute capability 8.9")
    return device


def test_benchmark_workloads_verify(kernel, fp8_device, bench):
    """The prefill size is cut to 256 tokens on the CPU."""
    seen = 0
    for cls, workload in benchmark_workloads(bench):
        instance = cls()
        instance.kernel, instance.device = kernel, fp8_device
        torch.manual_seed(instance.seed)
        old = bench.PREFILL_TOKENS
        bench.PREFILL_TOKENS = 256 if fp8_device == "cpu" else old
        try:
            getattr(instance, f"setup_{workload}")()
        finally:
            bench.PREFILL_TOKENS = old
        getattr(instance, f"benchmark_{workload}")()
        reference = getattr(instance, f"verify_{workload}")()
        assert reference.dtype == instance.out.dtype, workload
        assert torch.equal(instance.out, reference), f"{cls.__name__}.{workload}"
        seen += 1
    assert seen == 4


def test_sweep_baselines_match_ours(kernel, fp8_device, sweep):
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    x = x.to(fp8_device)
    scale = torch.tensor([0.05], device=fp8_device)
    for mode in sweep.MODES:
        got, want = sweep._ours(kernel, mode, scale)(x), sweep._eager(mode, scale)(x)
        for g, w in zip(got, want):
            if g is not None:
                assert_bitwise(g.reshape(w.shape), w)
