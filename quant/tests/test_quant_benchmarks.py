"""The benchmark scripts, checked without a GPU: benchmark.py's workloads run as `kernels
benchmark` runs them (setup, one call, verify, the runner's allclose with atol=1e-2) on the
`kernel` fixture's device, and sweep.py's eager baselines compute exactly what our ops compute
(bit for bit), so the timed contenders do the same work as ours. The scales of the eager code and
of `_reference` are checked against one correctly rounded division, because on CUDA a division by
a Python number multiplies by its reciprocal (two roundings)."""

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


def _rounded_once(numerator: torch.Tensor, divisor: float) -> torch.Tensor:
    """numerator / divisor (float32 numerator) rounded once to float32, computed on the CPU in
    float64: rounding the float64 quotient to float32 gives the correctly rounded float32
    quotient, as 53 >= 2 * 24 + 2 (double rounding is innocuous for division)."""
    return (numerator.cpu().double() / divisor).float()


# mode -> (what the eager code divides, from x in float32 on the CPU; the divisor; the floor)
_DIVIDED = {
    "fp8_per_tensor": (lambda xf: xf.abs().amax().reshape(1), 448.0, 1.0 / (448.0 * 512.0)),
    "fp8_per_token": (lambda xf: xf.abs().amax(-1, keepdim=True), 448.0, 1.0 / (448.0 * 512.0)),
    "fp8_group128": (
        lambda xf: xf.unflatten(-1, (-1, 128)).abs().amax(-1).clamp(min=1e-10),
        448.0,
        0.0,
    ),
    "int8_sym": (lambda xf: xf.abs().amax(-1, keepdim=True), 127.0, 0.0),
    "int8_asym": (lambda xf: xf.amax(-1, keepdim=True) - xf.amin(-1, keepdim=True), 255.0, 0.0),
}


def _scale_input(device: str) -> torch.Tensor:
    # 64 rows: the 1-ulp error of a reciprocal multiply showed on every row of the CUDA sweep, so
    # a few dozen rows make it visible; max > 448 * FP8_MIN_SCALE everywhere (no floor taken).
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    return x.to(device)


@pytest.mark.parametrize("mode", sorted(_DIVIDED))
def test_sweep_scales_divide_once(fp8_device, sweep, mode):
    x = _scale_input(fp8_device)
    numerator, divisor, floor = _DIVIDED[mode]
    expected = _rounded_once(numerator(x.cpu().float()), divisor).clamp(min=floor)
    scale = sweep._eager(mode, torch.tensor([0.05], device=fp8_device))(x)[1]
    assert_bitwise(scale.cpu(), expected)


@pytest.mark.parametrize(
    "name, mode",
    [
        ("dynamic_fp8", "fp8_per_tensor"),
        ("per_token_fp8", "fp8_per_token"),
        ("group_fp8", "fp8_group128"),
        ("per_token_int8", "int8_sym"),
    ],
)
def test_reference_scales_divide_once(kernel, fp8_device, name, mode):
    x = _scale_input(fp8_device)
    numerator, divisor, floor = _DIVIDED[mode]
    expected = _rounded_once(numerator(x.cpu().float()), divisor).clamp(min=floor)
    fn = getattr(kernel._reference, name)
    scale = fn(x, 128)[1] if name == "group_fp8" else fn(x)[1]
    assert_bitwise(scale.cpu(), expected)


def test_sweep_compiled_baselines_match_eager(fp8_device, sweep):
    """The compile contender computes what the eager code computes, bit for bit (Triton)."""
    if fp8_device == "cpu":
        pytest.skip(
            "CUDA only: the rounding traps are Inductor's Triton lowering (division by a constant "
            "as a multiply, approximate `/`); its CPU code divides exactly"
        )
    numerics = torch._inductor.config.eager_numerics
    old = numerics.division_rounding
    try:
        assert sweep.exact_compiled_division()
        x = torch.randn(33, 1024, device=fp8_device).to(torch.bfloat16)
        scale = torch.tensor([0.05], device=fp8_device)
        for mode in sweep.MODES:
            eager = sweep._eager(mode, scale)
            got, want = torch.compile(eager, dynamic=False)(x), eager(x)
            for g, w in zip(got, want):
                assert_bitwise(g, w)
    finally:
        numerics.division_rounding = old
