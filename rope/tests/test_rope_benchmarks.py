"""The benchmark scripts, checked without a GPU: benchmark.py's workloads run as `kernels
benchmark` runs them (setup, one call, verify, the runner's allclose with atol=1e-2) on the
`kernel` fixture's device, its fp32 references agree with the float64 ones of rope_cases.py,
and sweep.py's baselines compute the rotation they claim to (so the timed contenders do the same
work as ours). sweep.py's command line and case order are checked in tests/test_bench_table.py.
"""

from pathlib import Path

import pytest
import torch
from rope_cases import (
    BF16,
    assert_within,
    check,
    eager_bound,
    make_input,
    ref_transformers,
    ref_vllm,
)
from rope_fixture import benchmark_fixtures, benchmark_workloads

BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"


bench, sweep = benchmark_fixtures("rope", BENCH_DIR)


def test_benchmark_workloads_verify(kernel, device, bench):
    """Every workload, as the runner does it: seed, setup_<w>, benchmark_<w> once, verify_<w>,
    torch.allclose(out, reference, atol=1e-2) (kernels/cli/benchmark.py); the prefill sizes are
    cut to 256 tokens on the CPU (the shapes' other dimensions are kept)."""
    seen = 0
    for cls, workload in benchmark_workloads(bench):
        instance = cls()
        instance.kernel, instance.device = kernel, device
        torch.manual_seed(instance.seed)
        old = bench.PREFILL_TOKENS
        bench.PREFILL_TOKENS = 256 if device == "cpu" else old
        try:
            getattr(instance, f"setup_{workload}")()
        finally:
            bench.PREFILL_TOKENS = old
        getattr(instance, f"benchmark_{workload}")()
        reference = getattr(instance, f"verify_{workload}")()
        assert instance.out is not None and reference.dtype == instance.out.dtype, workload
        assert torch.allclose(instance.out, reference, atol=1e-2), f"{cls.__name__}.{workload}"
        seen += 1
    assert seen >= 5


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_benchmark_references(bench, is_neox):
    # benchmark.py's fp32 references rounded once: within one rounding (the kernel's bound) of
    # the float64 references.
    t, h, d, rot = 9, 3, 34, 18
    x = make_input((t, h * d), BF16, "cpu")
    positions = torch.randint(0, 64, (t,), generator=torch.Generator().manual_seed(1))
    cache = bench.cos_sin_cache(64, rot, "cpu")
    got = bench.reference_rotary_embedding(positions, x, d, cache, is_neox)
    ref = ref_vllm(positions, x, d, cache, is_neox)
    check(got, ref, "benchmark.reference_rotary_embedding", exact=False)
    q = make_input((2, h, 5, d), BF16, "cpu", seed=2)
    cos, sin = (
        torch.rand(2, 5, d, dtype=torch.float64).cos().to(BF16),
        torch.rand(2, 5, d, dtype=torch.float64).sin().to(BF16),
    )
    check(
        bench.reference_transformers(q, cos, sin),
        ref_transformers(q, cos, sin),
        "benchmark.reference_transformers",
        exact=False,
    )


def test_sweep_baselines(sweep):
    """The sweep's eager baselines (run here on the CPU at a small size) rotate q and k as ours
    does: transformers-style and vLLM's in-place formulation round cos/sin to bf16 and each
    product (eager_bound, with the table's own rounding to bf16 added: |x| 2**-9 per term)."""
    t, d = 7, 16
    q_size, kv_size = sweep.Q_HEADS // 8 * d, sweep.KV_HEADS // 8 * d  # 4 and 1 heads
    qkv = make_input((t, q_size + 2 * kv_size), BF16, "cpu")
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    positions = torch.randint(0, 64, (t,), generator=torch.Generator().manual_seed(1))
    cache = sweep.cos_sin_cache(64, d, "cpu")
    ref_q, ref_k = ref_vllm(positions, q, d, cache, True), ref_vllm(positions, k, d, cache, True)

    def bound(ref):
        # the fp32 cache rounded to bf16 (relative 2**-9 of each coefficient: of each term of mag)
        return eager_bound(ref, BF16) + 2.0**-9 * (1 + 2.0**-8) * ref.mag

    got_q, got_k = sweep.rope_rotate_half(q, k, positions, cache)
    assert_within(got_q.flatten(-2), ref_q.value, bound(ref_q), "rope_rotate_half q")
    assert_within(got_k.flatten(-2), ref_k.value, bound(ref_k), "rope_rotate_half k")
    v0 = v.clone()
    buf = qkv.clone()
    sweep.rope_in_place(buf, positions, cache, q_size, kv_size)
    assert_within(buf[:, :q_size], ref_q.value, bound(ref_q), "rope_in_place q")
    assert_within(buf[:, q_size : q_size + kv_size], ref_k.value, bound(ref_k), "rope_in_place k")
    assert torch.equal(buf[:, q_size + kv_size :], v0)

    # transformers' apply_rotary_pos_emb as the sweep copies it
    qh = make_input((1, 4, t, d), BF16, "cpu", seed=3)
    kh = make_input((1, 1, t, d), BF16, "cpu", seed=4)
    cos, sin = sweep.cos_sin_cache(t, d, "cpu").chunk(2, dim=-1)
    cos = torch.cat([cos, cos], -1).to(BF16)[None]
    sin = torch.cat([sin, sin], -1).to(BF16)[None]
    eq, ek = sweep.apply_rotary_pos_emb(qh, kh, cos, sin)
    for got, x in ((eq, qh), (ek, kh)):
        ref = ref_transformers(x, cos, sin)
        assert_within(got, ref.value, eager_bound(ref, BF16), "apply_rotary_pos_emb")
