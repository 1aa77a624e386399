"""The benchmark scripts, checked without a GPU: benchmark.py's workloads run as `kernels benchmark`
runs them (seed, setup, one call, verify, the runner's allclose with atol=1e-2) on the `kernel`
fixture's device, with the sizes cut down on the CPU; their reference (the package's private
_reference) and the sweep's sampled-row reference agree with the float64 reference of
attention_cases.py; the sweep's FLOP
and byte counts follow its stated formulas. The sweep's case order and command line are checked
in tests/test_bench_table.py.
"""

from pathlib import Path

import pytest
import torch
from attention_cases import BF16, randn, ref_attention
from attention_fixture import benchmark_fixtures, benchmark_workloads

BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"


bench, sweep = benchmark_fixtures("attention", BENCH_DIR)


def test_benchmark_workloads_verify(kernel, device, bench, monkeypatch):
    """Every workload as the runner runs it (kernels/cli/benchmark.py); on the CPU the prompts are
    256 tokens and the decode context 512 (the models' head shapes are kept)."""
    if device == "cpu":
        monkeypatch.setattr(bench, "PREFILL_TOKENS", 256)
        monkeypatch.setattr(bench, "DECODE_CONTEXT", 512)
        monkeypatch.setattr(bench, "DECODE_BATCH", 3)
    seen = 0
    for cls, workload in benchmark_workloads(bench):
        instance = cls()
        instance.kernel, instance.device = kernel, device
        torch.manual_seed(instance.seed)
        getattr(instance, f"setup_{workload}")()
        getattr(instance, f"benchmark_{workload}")()
        reference = getattr(instance, f"verify_{workload}")()
        assert instance.out is not None and reference.dtype == instance.out.dtype, workload
        assert torch.allclose(instance.out, reference, atol=1e-2), f"{cls.__name__}.{workload}"
        assert instance.out.abs().max() < 2, "outputs must stay below 2 (the atol argument)"
        seen += 1
    assert seen >= 6


def test_references_agree_with_float64(kernel, sweep):
    q = randn((37, 4, 64), BF16, "cpu", seed=1)
    k = randn((50, 2, 64), BF16, "cpu", seed=2)
    v = randn((50, 2, 64), BF16, "cpu", seed=3)
    ref, _ = ref_attention(q, k, v, 64**-0.5, causal=True)
    got, _ = kernel._reference.attention(q, k, v, causal=True)
    assert (got.double() - ref).abs().max() < 1e-5
    rows = torch.tensor([0, 5, 36])
    got = sweep.reference_rows(q, k, v, rows, causal=True)
    assert (got.double() - ref[rows]).abs().max() < 1e-5
    slopes = torch.rand(4) * 0.3
    ref, ref_lse = ref_attention(
        q, k, v, 0.1, causal=True, window=(9, 0), softcap=2.0, slopes=slopes
    )
    got, lse = kernel._reference.attention(
        q, k, v, 0.1, True, (9, 0), 2.0, slopes, dtype=torch.float64
    )
    assert (got - ref).abs().max() < 1e-12 and torch.allclose(lse, ref_lse)


def test_sweep_counts(sweep):
    c = sweep.Case("prefill", "bfloat16", 8, 2048, 128, 32, 32, causal=True)
    assert sweep.flops(c) == 4 * 8 * 32 * 2048 * 2048 * 128 // 2
    assert sweep.flops(
        sweep.Case("prefill", "bfloat16", 8, 2048, 128, 32, 32, causal=False)
    ) == 2 * sweep.flops(c)
    # a head dim between the instances counts its own FLOPs (80, not the 96 of the kernel it runs)
    e = sweep.Case("prefill", "bfloat16", 8, 2048, 80, 32, 32, causal=True)
    assert sweep.flops(e) == 4 * 8 * 32 * 2048 * 2048 * 80 // 2
    d = sweep.Case("decode", "bfloat16", 64, 32768, 128, 32, 8, layout="paged16")
    assert sweep.kv_bytes(d) == 2 * 64 * 32768 * 8 * 128 * 2


def test_sweep_times_a_baseline_without_graph_when_capture_fails(sweep, monkeypatch):
    """A baseline named in graph_may_fail whose CUDA-graph capture fails is timed by plain
    launches and listed as such (null, with both errors, if that fails too); any other call's
    capture failure stops the sweep."""

    def capture_fails():
        raise RuntimeError("operation failed due to a previous error during capture")

    monkeypatch.setattr(sweep, "_timed", lambda fn: fn())
    monkeypatch.setattr(sweep.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(sweep.benchlib, "wall_time_us", lambda fn, rep_ms: 7.0)
    calls = {"ours": lambda: (3.0, None), "sdpa_cudnn": capture_fails}
    with pytest.raises(RuntimeError, match="during capture"):
        sweep._timed_all(calls)
    r = sweep._timed_all(calls, graph_may_fail=("sdpa_cudnn",))
    assert r["us"] == {"ours": 3.0, "sdpa_cudnn": 7.0}
    assert r["timed_without_graph"] == ["sdpa_cudnn"] and "unsupported" not in r

    def launch_fails(fn, rep_ms):
        raise RuntimeError("no nested tensor support")

    monkeypatch.setattr(sweep.benchlib, "wall_time_us", launch_fails)
    r = sweep._timed_all(calls, graph_may_fail=("sdpa_cudnn",))
    assert r["us"]["sdpa_cudnn"] is None and "timed_without_graph" not in r
    assert "during capture" in r["unsupported"]["sdpa_cudnn"]
    assert "without a graph" in r["unsupported"]["sdpa_cudnn"]
