"""The benchmark scripts, checked without a GPU: benchmark.py's workloads run as `kernels
benchmark` runs them (setup, one call, verify, the runner's allclose with atol=1e-2) on the
`kernel` fixture's device, and sweep.py's cases and baseline do what they claim."""

from pathlib import Path

import torch
from newkernel_cases import assert_within_bound, make_input
from newkernel_fixture import benchmark_fixtures, benchmark_workloads

BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"

bench, sweep = benchmark_fixtures("newkernel", BENCH_DIR)


def test_benchmark_workloads_verify(kernel, device, bench):
    seen = 0
    for cls, workload in benchmark_workloads(bench):
        instance = cls()
        instance.kernel, instance.device = kernel, device
        torch.manual_seed(instance.seed)
        getattr(instance, f"setup_{workload}")()
        instance.out.fill_(float("nan"))
        getattr(instance, f"benchmark_{workload}")()
        reference = getattr(instance, f"verify_{workload}")()
        assert reference.dtype == instance.out.dtype, workload
        assert torch.allclose(instance.out, reference, atol=1e-2), f"{cls.__name__}.{workload}"
        seen += 1
    assert seen >= 2


def test_sweep_cases_and_baseline(kernel, sweep):
    full = sweep.cases(quick=False)
    assert len(set(full)) == len(full) and set(sweep.cases(quick=True)) <= set(full)
    assert full[0].dtype == "bfloat16"  # the README's rows come first (the budget cuts the end)
    x = make_input((7, 13), torch.float64, "cpu")
    assert_within_bound(sweep.eager_scale(x), kernel._reference.scale(x, sweep.ALPHA), "eager")
    args = sweep.parse_args(["--quick", "--budget-s", "30"])
    assert args.quick and args.budget_s == 30
