"""The attention backward (attn_bwd; the CPU kernel, and on a CUDA build the mma.sync kernels): dq, dk, dv against float64 autograd of the reference
formula, for every mode the forward has (causal, sliding window, softcap, ALiBi, MQA / GQA,
S_q != S_k, rows that see no key, varlen), with deterministic=True (on CUDA a dQ pass of its own)
and False (on CUDA dQ added with atomics; the CPU is deterministic either way). The error bound
is twice that of PyTorch's own autograd of the same formula in the input dtype against float64
(the issue's "2x SDPA's own gradient error"), plus a floor of 8 units of roundoff of the largest
gradient."""

import pytest
import torch
from attention_cases import (
    UNIT,
    alibi_slopes,
    bias,
    cu_seqlens,
    dtype_id,
    randn,
    scores,
    visible,
)
from attention_fixture import assert_autograd_routes_agree

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def kernel_dtype(device, dtype=torch.float32):
    """`dtype` where the build's kernels take it; CUDA takes float16 and bfloat16 only, so float32
    cases run in bfloat16 there."""
    return torch.bfloat16 if device == "cuda" and dtype == torch.float32 else dtype


def cpu_only_dtype(device, dtype):
    if device == "cuda" and dtype not in (torch.float16, torch.bfloat16):
        pytest.skip("CUDA kernels take float16 and bfloat16")


def formula(q, k, v, scale, causal, window, softcap, slopes):
    """Differentiable attention of one sequence in q's dtype: q [S_q, H, D], k / v [S_k, H_kv, D]
    -> out [S_q, H, D]; rows with no visible key give 0."""
    sq, sk = q.shape[0], k.shape[0]
    s, vt = scores(q, k, v, scale, softcap)
    b = bias(sq, sk, slopes)
    if b is not None:
        s = s + b.to(s.dtype)
    mask = visible(sq, sk, causal, window)
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return (p @ vt).transpose(0, 1)


def grads(q, k, v, dout, dtype, **opts):
    """(dq, dk, dv) of sum(out * dout) by autograd of `formula` in `dtype`, as float64."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out = formula(*leaves, **opts)
    out.backward(dout.to(dtype))
    return [t.grad.double() for t in leaves]


def scalars(opts) -> tuple:
    """softmax_scale, softcap, causal, window_left, window_right: both ops' trailing options."""
    return opts["scale"], opts["softcap"], opts["causal"], opts["window"][0], opts["window"][1]


def forward(kernel, q, k, v, opts, cu_q=None, cu_k=None, max_q=0, max_k=0):
    """(out, lse) of the forward op behind the Python API, for the batch (dense [B, S, H, D], or
    varlen packed rows)."""
    return kernel.ops.attn_func(
        q, k, v, cu_q, cu_k, None, None, None, None, opts["slopes"], max_q, max_k, *scalars(opts), 0
    )


def backward(
    kernel,
    dout,
    q,
    k,
    v,
    out,
    lse,
    opts,
    cu_q=None,
    cu_k=None,
    max_q=0,
    max_k=0,
    deterministic=True,
):
    """(dq, dk, dv) of attn_bwd, each written into a NaN-filled tensor (an element it leaves
    unwritten fails the comparison). deterministic=True by default: the tests that compare bits
    between two calls need it on CUDA."""
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    kernel.ops.attn_bwd(
        dq,
        dk,
        dv,
        dout,
        q,
        k,
        v,
        out,
        lse,
        cu_q,
        cu_k,
        opts["slopes"],
        max_q,
        max_k,
        *scalars(opts),
        deterministic,
    )
    return dq, dk, dv


def assert_grads(got, q, k, v, dout, dtype, what, **opts):
    """got (dq, dk, dv) of one sequence against float64 autograd, within twice the error of
    PyTorch's autograd in `dtype` plus a floor."""
    q, k, v, dout = (t.cpu() for t in (q, k, v, dout))
    got = [g.cpu() for g in got]
    if opts.get("slopes") is not None:
        opts = dict(opts, slopes=opts["slopes"].cpu())
    exact = grads(q, k, v, dout, torch.float64, **opts)
    torch_grads = grads(q, k, v, dout, dtype, **opts)
    for name, g, want, theirs in zip(("dq", "dk", "dv"), got, exact, torch_grads):
        floor = 8 * UNIT[dtype] * float(want.abs().max())
        err = float((g.double() - want).abs().max())
        torch_err = float((theirs - want).abs().max())
        assert err <= 2 * torch_err + floor, (
            f"{what} {name}: error {err:.3g}, PyTorch's {torch_err:.3g} (floor {floor:.3g})"
        )


# (S_q, S_k, H, H_kv, D, causal, window, softcap, alibi)
CASES = [
    (37, 37, 4, 4, 32, False, (-1, -1), 0.0, False),
    (37, 37, 4, 2, 32, True, (-1, -1), 0.0, False),  # GQA, causal
    (20, 45, 6, 1, 16, True, (-1, -1), 0.0, False),  # MQA, fewer queries than keys
    (45, 20, 2, 2, 24, True, (-1, -1), 0.0, False),  # more queries: rows that see no key
    (40, 40, 4, 2, 32, False, (8, 3), 0.0, False),  # sliding window
    (33, 33, 2, 2, 40, True, (-1, -1), 5.0, False),  # softcap
    (33, 50, 4, 2, 32, True, (-1, -1), 0.0, True),  # ALiBi
    (30, 30, 4, 4, 8, False, (5, -1), 3.0, True),  # everything at once
    # Several 64-row blocks of queries and keys (the CUDA kernels' tiles), each head dim instance.
    (150, 150, 4, 2, 64, True, (-1, -1), 0.0, False),
    (130, 200, 4, 1, 128, False, (70, 10), 0.0, False),
    (200, 90, 2, 2, 96, True, (-1, -1), 0.0, False),
    (129, 129, 4, 2, 128, True, (-1, -1), 20.0, True),
    (130, 150, 4, 2, 256, True, (-1, -1), 0.0, False),  # two warps a key slab on CUDA
    (70, 100, 2, 1, 192, False, (30, 5), 10.0, True),  # on CUDA the 256 instance, zero columns
    (65, 80, 2, 2, 100, True, (-1, -1), 0.0, False),  # CUDA: zero-padded copies (head dim 104)
]
# What the Hopper backward takes on capability 9.0 (deterministic=False): head dims 64, 128 and
# 256, and the multiples of 8 from 40 below them (zero-padded by TMA), any window, no score
# modifier; MQA with more keys than queries, causal with rows that see no key.
# The Hopper kernel splits a GQA group over several CTAs when one CTA per (key block, kv head,
# batch) would leave the GPU unevenly loaded (group_splits in attention_sm90_bwd.cuh). On an
# H100 or H200 (114-132 SMs) the small cases split each group all the way (into one CTA per query
# head), the 1024-token causal case in two, and the non-causal one not at all (GQA unsplit).
HOPPER_CASES = [
    (130, 200, 4, 1, 128, False, (-1, -1), 0.0, False),
    (200, 130, 4, 2, 128, True, (-1, -1), 0.0, False),
    (150, 150, 4, 2, 64, True, (-1, -1), 0.0, False),
    (77, 300, 2, 1, 64, False, (-1, -1), 0.0, False),
    (100, 140, 4, 2, 120, True, (-1, -1), 0.0, False),  # the 128 instance, zero-filled columns
    (130, 200, 4, 2, 96, False, (-1, -1), 0.0, False),  # Phi-3's head dim, on the 128 instance
    (200, 130, 4, 1, 80, True, (-1, -1), 0.0, False),
    (150, 150, 4, 2, 40, True, (-1, -1), 0.0, False),  # the 64 instance
    (1024, 1024, 32, 8, 96, True, (-1, -1), 0.0, False),  # a split group at head dim 96
    (1024, 1024, 32, 8, 128, True, (-1, -1), 0.0, False),
    (1024, 1024, 32, 8, 64, False, (-1, -1), 0.0, False),
    # Sliding windows: a band on both sides; causal with a left side and more keys than queries;
    # a right side only with more queries than keys (rows 0-129 see no key); Mistral's window at
    # Llama's heads (the split group).
    (200, 130, 4, 2, 128, False, (40, 10), 0.0, False),
    (150, 300, 4, 1, 64, True, (70, 0), 0.0, False),
    (300, 150, 4, 2, 128, False, (-1, 20), 0.0, False),
    (1024, 1024, 32, 8, 128, True, (256, 0), 0.0, False),
    # The 256 instance (64-key blocks, the head dim split between the warpgroups, dQ by atomics):
    # its own head dim, Gemma's and 192 / 136 zero-padded to it, windows, a split group.
    (130, 200, 4, 1, 256, False, (-1, -1), 0.0, False),
    (200, 130, 4, 2, 256, True, (-1, -1), 0.0, False),
    (150, 150, 4, 2, 192, True, (-1, -1), 0.0, False),
    (77, 300, 2, 1, 136, False, (-1, -1), 0.0, False),
    (200, 130, 4, 2, 256, False, (40, 10), 0.0, False),
    (1024, 1024, 32, 8, 256, True, (-1, -1), 0.0, False),
    (1024, 1024, 16, 16, 256, False, (-1, -1), 0.0, False),
]


def _id(c):
    sq, sk, h, hk, d, causal, window, cap, alibi = c
    return (
        f"q{sq}_k{sk}_h{h}x{hk}_d{d}"
        + "_causal" * causal
        + (f"_w{window[0]}x{window[1]}" if window != (-1, -1) else "")
        + (f"_cap{cap:g}" if cap else "")
        + "_alibi" * alibi
    )


# Both backward schedules (CUDA; the CPU computes the same either way).
MODES = pytest.mark.parametrize("deterministic", [True, False], ids=["det", "nondet"])


@MODES
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_bwd_against_float64_autograd(kernel, device, dtype, case, deterministic):
    cpu_only_dtype(device, dtype)
    check_against_float64_autograd(kernel, device, dtype, case, deterministic)


@MODES
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("case", HOPPER_CASES, ids=_id)
def test_bwd_hopper_cases_against_float64_autograd(kernel, device, dtype, case, deterministic):
    """CUDA: the Hopper backward's shapes (deterministic=False runs it on capability 9.0, True the
    mma.sync kernels), under test_bwd_against_float64_autograd's bound."""
    if device != "cuda":
        pytest.skip("the shapes of a CUDA kernel")
    check_against_float64_autograd(kernel, device, dtype, case, deterministic)


def check_against_float64_autograd(kernel, device, dtype, case, deterministic):
    sq, sk, h, hk, d, causal, window, cap, alibi = case
    batch = 2
    q = randn((batch, sq, h, d), dtype, device, seed=sq + h)
    k = randn((batch, sk, hk, d), dtype, device, seed=sk + hk + 1)
    v = randn((batch, sk, hk, d), dtype, device, seed=sk + d + 2)
    dout = randn((batch, sq, h, d), dtype, device, seed=3)
    slopes = alibi_slopes(h, device) if alibi else None
    opts = dict(scale=d**-0.5, causal=causal, window=window, softcap=cap, slopes=slopes)
    out, lse = forward(kernel, q, k, v, opts)
    dq, dk, dv = backward(kernel, dout, q, k, v, out, lse, opts, deterministic=deterministic)
    for b in range(batch):
        assert_grads((dq[b], dk[b], dv[b]), q[b], k[b], v[b], dout[b], dtype, f"batch {b}", **opts)


@MODES
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_bwd_varlen(kernel, device, dtype, deterministic):
    """Packed sequences of different lengths (one with no key rows visible to its first queries,
    one longer than a 64-row block), GQA, causal: each sequence's gradients as if computed alone;
    the packed rows past the last sequence get zeros."""
    cpu_only_dtype(device, dtype)
    lens_q, lens_k = [5, 33, 17, 70], [9, 33, 40, 100]
    h, hk, d = 4, 2, 16
    cu_q, cu_k = cu_seqlens(lens_q, device), cu_seqlens(lens_k, device)
    q = randn((sum(lens_q) + 3, h, d), dtype, device, seed=4)
    k = randn((sum(lens_k) + 2, hk, d), dtype, device, seed=5)
    v = randn((sum(lens_k) + 2, hk, d), dtype, device, seed=6)
    dout = randn((sum(lens_q) + 3, h, d), dtype, device, seed=7)
    opts = dict(scale=d**-0.5, causal=True, window=(-1, -1), softcap=0.0, slopes=None)
    sizes = (cu_q, cu_k, max(lens_q), max(lens_k))
    out, lse = forward(kernel, q, k, v, opts, *sizes)
    dq, dk, dv = backward(
        kernel, dout, q, k, v, out, lse, opts, *sizes, deterministic=deterministic
    )
    for i in range(len(lens_q)):
        rq = slice(int(cu_q[i]), int(cu_q[i + 1]))
        rk = slice(int(cu_k[i]), int(cu_k[i + 1]))
        assert_grads(
            (dq[rq], dk[rk], dv[rk]), q[rq], k[rk], v[rk], dout[rq], dtype, f"seq {i}", **opts
        )
    assert not dq[sum(lens_q) :].any() and not dk[sum(lens_k) :].any()
    assert not dv[sum(lens_k) :].any()


def test_bwd_is_deterministic(kernel, device):
    """deterministic=True: tasks (CPU) and CTAs (CUDA) own disjoint rows, with no atomics, so the
    same bits on every run, whatever the thread count (test_bwd_atomic_dq_matches_deterministic
    covers more shapes on CUDA)."""
    q = randn((2, 160, 4, 32), torch.bfloat16, device, seed=8)
    k = randn((2, 160, 2, 32), torch.bfloat16, device, seed=9)
    dout = randn((2, 160, 4, 32), torch.bfloat16, device, seed=10)
    opts = dict(scale=32**-0.5, causal=True, window=(-1, -1), softcap=0.0, slopes=None)
    out, lse = forward(kernel, q, k, k, opts)
    if device == "cuda":
        runs = [backward(kernel, dout, q, k, k, out, lse, opts) for _ in range(3)]
        assert all(torch.equal(a, b) for run in runs[1:] for a, b in zip(runs[0], run))
        return
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = backward(kernel, dout, q, k, k, out, lse, opts)
        torch.set_num_threads(max(2, threads))
        many = backward(kernel, dout, q, k, k, out, lse, opts)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, many))


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_bwd_atomic_dq_matches_deterministic(kernel, device, case, monkeypatch):
    """CUDA, mma.sync kernels (the Hopper backward off): deterministic=True (dQ in a pass of its
    own) gives the same bits on every run, and deterministic=False (dQ added with fp32 atomics
    during the dK/dV pass) gives dK and dV equal to those bits and dQ, whose sums run in a
    varying order, within the float64 bound of the other tests; for each mode, head dim and
    length off the 64-row tiles, dense and varlen (with a sequence without queries and one
    without keys)."""
    if device != "cuda":
        pytest.skip("the CPU backward is deterministic either way")
    monkeypatch.setenv("ATTENTION_HOPPER", "0")
    sq, sk, h, hk, d, causal, window, cap, alibi = case
    q = randn((2, sq, h, d), torch.bfloat16, device, seed=sq + h)
    k = randn((2, sk, hk, d), torch.bfloat16, device, seed=sk + hk + 1)
    v = randn((2, sk, hk, d), torch.bfloat16, device, seed=sk + d + 2)
    dout = randn((2, sq, h, d), torch.bfloat16, device, seed=3)
    slopes = alibi_slopes(h, device) if alibi else None
    opts = dict(scale=d**-0.5, causal=causal, window=window, softcap=cap, slopes=slopes)
    out, lse = forward(kernel, q, k, v, opts)
    lens_q, lens_k = [5, 70, 0, 33], [9, 100, 4, 0]
    cu_q, cu_k = cu_seqlens(lens_q, device), cu_seqlens(lens_k, device)
    pq = randn((sum(lens_q), h, d), torch.bfloat16, device, seed=4)
    pk = randn((sum(lens_k), hk, d), torch.bfloat16, device, seed=5)
    pv = randn((sum(lens_k), hk, d), torch.bfloat16, device, seed=6)
    pdout = randn((sum(lens_q), h, d), torch.bfloat16, device, seed=7)
    sizes = (cu_q, cu_k, max(lens_q), max(lens_k))
    pout, plse = forward(kernel, pq, pk, pv, opts, *sizes)

    def run(deterministic):
        dense = backward(kernel, dout, q, k, v, out, lse, opts, deterministic=deterministic)
        packed = backward(
            kernel, pdout, pq, pk, pv, pout, plse, opts, *sizes, deterministic=deterministic
        )
        return (*dense, *packed)

    first, again, atomic = run(True), run(True), run(False)
    names = ("dq", "dk", "dv", "varlen dq", "varlen dk", "varlen dv")
    for name, one, two, three in zip(names, first, again, atomic):
        assert not one.isnan().any() and not three.isnan().any(), f"{name}: left unwritten"
        assert torch.equal(one, two), f"{name}: deterministic=True differs between runs"
        if "dq" not in name:
            assert torch.equal(one, three), f"{name}: deterministic=False differs"
    dq, dk, dv, pdq, pdk, pdv = atomic
    for b in range(2):
        assert_grads(
            (dq[b], dk[b], dv[b]), q[b], k[b], v[b], dout[b], torch.bfloat16, "atomic", **opts
        )
    for i in range(len(lens_q)):
        rq = slice(int(cu_q[i]), int(cu_q[i + 1]))
        rk = slice(int(cu_k[i]), int(cu_k[i + 1]))
        what = f"atomic, seq {i}"
        if lens_q[i] == 0 or lens_k[i] == 0:  # no score at all: zero gradients
            assert not pdq[rq].any() and not pdk[rk].any() and not pdv[rk].any(), what
            continue
        assert_grads(
            (pdq[rq], pdk[rk], pdv[rk]),
            pq[rq],
            pk[rk],
            pv[rk],
            pdout[rq],
            torch.bfloat16,
            what,
            **opts,
        )


@pytest.mark.parametrize("head_dim", [40, 64, 96, 128, 192, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
def test_bwd_hopper_kernel_runs(kernel, device, dtype, head_dim, monkeypatch):
    """Capability 9.0: a deterministic=False backward at head dims 40 to 256 runs the Hopper
    kernel, with a sliding window too (its gradients are checked by
    test_bwd_hopper_cases_against_float64_autograd), and neither deterministic=True nor
    ATTENTION_HOPPER=0 does."""
    if device != "cuda" or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper backward runs on capability 9.0")
    q = randn((2, 200, 4, head_dim), dtype, device, seed=11).requires_grad_()
    k = randn((2, 130, 2, head_dim), dtype, device, seed=12).requires_grad_()

    def kernels_of(**kw):
        out = kernel.flash_attn_func(q, k, k, causal=True, **kw)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out.backward(torch.ones_like(out))
            torch.cuda.synchronize()
        return " ".join(e.name for e in prof.events())

    assert "attn_bwd_sm90" in kernels_of()
    assert "attn_bwd_sm90" in kernels_of(window_size=(40, 0))  # a sliding window too
    assert "attn_bwd_sm90" not in kernels_of(deterministic=True)
    monkeypatch.setenv("ATTENTION_HOPPER", "0")
    assert "attn_bwd_sm90" not in kernels_of()


HOPPER_VARLEN_MODES = {
    "full": (False, (-1, -1)),
    "causal": (True, (-1, -1)),
    "window": (False, (60, 20)),
}


@pytest.mark.parametrize("mode", list(HOPPER_VARLEN_MODES))
@pytest.mark.parametrize("head_dim", [40, 64, 96, 128, 256])
def test_bwd_hopper_varlen(kernel, device, head_dim, mode):
    """Capability 9.0: a varlen backward (deterministic=False) runs the Hopper kernel, and each
    sequence's gradients match float64 autograd of it alone: sequences without queries or keys,
    key blocks that run into the next sequence's rows (which must not count), several 128-key and
    64-query blocks, GQA."""
    if device != "cuda" or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper backward runs on capability 9.0")
    causal, window = HOPPER_VARLEN_MODES[mode]
    lens_q, lens_k = [130, 0, 77, 1, 300], [200, 50, 0, 129, 260]
    h, hk = 4, 2
    dtype = torch.bfloat16
    cu_q, cu_k = cu_seqlens(lens_q, device), cu_seqlens(lens_k, device)
    q = randn((sum(lens_q), h, head_dim), dtype, device, seed=21)
    k = randn((sum(lens_k), hk, head_dim), dtype, device, seed=22)
    v = randn((sum(lens_k), hk, head_dim), dtype, device, seed=23)
    dout = randn((sum(lens_q), h, head_dim), dtype, device, seed=24)
    opts = dict(scale=head_dim**-0.5, causal=causal, window=window, softcap=0.0, slopes=None)
    sizes = (cu_q, cu_k, max(lens_q), max(lens_k))
    out, lse = forward(kernel, q, k, v, opts, *sizes)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        dq, dk, dv = backward(kernel, dout, q, k, v, out, lse, opts, *sizes, deterministic=False)
        torch.cuda.synchronize()
    assert "attn_bwd_sm90" in " ".join(e.name for e in prof.events())
    for i in range(len(lens_q)):
        rq = slice(int(cu_q[i]), int(cu_q[i + 1]))
        rk = slice(int(cu_k[i]), int(cu_k[i + 1]))
        what = f"{mode} d{head_dim} seq {i}"
        if lens_q[i] == 0 or lens_k[i] == 0:  # no score at all: zero gradients
            assert not dq[rq].any() and not dk[rk].any() and not dv[rk].any(), what
            continue
        assert_grads((dq[rq], dk[rk], dv[rk]), q[rq], k[rk], v[rk], dout[rq], dtype, what, **opts)


def test_bwd_errors_name_the_argument(kernel, device):
    q = randn((1, 8, 2, 16), kernel_dtype(device), device)
    opts = dict(scale=0.25, causal=False, window=(-1, -1), softcap=0.0, slopes=None)
    out, lse = forward(kernel, q, q, q, opts)
    dq, dk, dv = (torch.empty_like(q) for _ in range(3))
    args = lambda **kw: dict(  # noqa: E731
        dict(dq=dq, dk=dk, dv=dv, dout=torch.randn_like(q), q=q, k=q, v=q, out=out, lse=lse), **kw
    )

    def call(a):
        kernel.ops.attn_bwd(
            a["dq"],
            a["dk"],
            a["dv"],
            a["dout"],
            a["q"],
            a["k"],
            a["v"],
            a["out"],
            a["lse"],
            None,
            None,
            None,
            0,
            0,
            0.25,
            0.0,
            False,
            -1,
            -1,
            True,
        )

    with pytest.raises(RuntimeError, match=r"attn_bwd: dq must have the shape of q"):
        call(args(dq=q.new_empty((1, 8, 2, 8))))
    with pytest.raises(RuntimeError, match=r"attn_bwd: dout must have the dtype of out"):
        call(args(dout=q.double()))
    with pytest.raises(RuntimeError, match=r"attn_bwd: dk must not share memory with q"):
        call(args(dk=q))
    with pytest.raises(RuntimeError, match=r"attn_bwd: lse must have shape"):
        call(args(lse=lse[:, :1]))


def test_opcheck_attn_bwd(kernel, device):
    """Schema (dq, dk, dv the only tensors written), fake kernel and AOT dispatch: dense with
    softcap and ALiBi (deterministic), and varlen without (dQ by atomics on CUDA; opcheck compares
    within tolerances)."""
    slopes = alibi_slopes(4, device)
    cu = cu_seqlens([4, 9], device)
    dtype = kernel_dtype(device)
    cases = [  # (q, k, options, (cu_q, cu_k, max_q, max_k), deterministic)
        (
            randn((2, 9, 4, 16), dtype, device, seed=11),
            randn((2, 12, 2, 16), dtype, device, seed=12),
            dict(scale=0.25, causal=True, window=(-1, -1), softcap=2.0, slopes=slopes),
            (None, None, 0, 0),
            True,
        ),
        (
            randn((13, 4, 16), dtype, device, seed=13),
            randn((13, 2, 16), dtype, device, seed=14),
            dict(scale=0.25, causal=False, window=(-1, -1), softcap=0.0, slopes=None),
            (cu, cu, 9, 9),
            False,
        ),
    ]
    for q, k, opts, sizes, deterministic in cases:
        out, lse = forward(kernel, q, k, k, opts, *sizes)
        cu_q, cu_k, max_q, max_k = sizes
        args = (
            torch.empty_like(q),
            torch.empty_like(k),
            torch.empty_like(k),
            torch.randn_like(out),
        )
        args += (q, k, k, out, lse, cu_q, cu_k, opts["slopes"], max_q, max_k, *scalars(opts))
        torch.library.opcheck(kernel.ops.attn_bwd.default, args + (deterministic,))


# ---- through autograd: the public functions ----


def test_flash_attn_func_backward_is_attn_bwd(kernel, device):
    """loss.backward() through flash_attn_func (softcap, window, ALiBi, GQA) gives attn_bwd's
    gradients bit for bit, and through the qkv-packed form the sum of its three slices
    (deterministic=True, so that two calls agree on CUDA too)."""
    dtype = torch.bfloat16
    q = randn((2, 21, 4, 16), dtype, device, seed=15).requires_grad_()
    k = randn((2, 30, 2, 16), dtype, device, seed=16).requires_grad_()
    v = randn((2, 30, 2, 16), dtype, device, seed=17).requires_grad_()
    dout = randn((2, 21, 4, 16), dtype, device, seed=18)
    slopes = alibi_slopes(4, device)
    kw = dict(
        causal=True, window_size=(6, -1), softcap=4.0, alibi_slopes=slopes, deterministic=True
    )
    kernel.flash_attn_func(q, k, v, **kw).backward(dout)
    opts = dict(scale=16**-0.5, causal=True, window=(6, -1), softcap=4.0, slopes=slopes)
    qd, kd, vd = (t.detach() for t in (q, k, v))
    out, lse = forward(kernel, qd, kd, vd, opts)
    want = backward(kernel, dout, qd, kd, vd, out, lse, opts)
    for got, w in zip((q.grad, k.grad, v.grad), want):
        assert torch.equal(got, w)

    qkv = randn((1, 12, 3, 2, 16), dtype, device, seed=19).requires_grad_()
    kernel.flash_attn_qkvpacked_func(qkv, causal=True, deterministic=True).sum().backward()
    parts = [t.detach() for t in qkv.unbind(2)]
    plain = dict(scale=16**-0.5, causal=True, window=(-1, -1), softcap=0.0, slopes=None)
    out, lse = forward(kernel, *parts, plain)
    want = backward(kernel, torch.ones_like(out), *parts, out, lse, plain)
    assert torch.equal(qkv.grad, torch.stack(want, dim=2))


def test_eager_autograd_route_matches_the_custom_op(kernel, device):
    """Eager calls that autograd records skip the custom op's autograd layer (its host time,
    _eager_path says why) and give the op's results: dense and varlen forms
    (deterministic=True, so that two calls agree on CUDA too)."""
    dtype = kernel_dtype(device)
    q = randn((2, 13, 4, 16), dtype, device, seed=40).requires_grad_()
    k = randn((2, 17, 2, 16), dtype, device, seed=41).requires_grad_()
    v = randn((2, 17, 2, 16), dtype, device, seed=42).requires_grad_()
    assert_autograd_routes_agree(
        lambda: kernel.flash_attn_func(q, k, v, causal=True, deterministic=True),
        (q, k, v),
        "AttnFuncEager",
    )
    cu = cu_seqlens([6, 7], device)
    qp, kp = q[0].detach().requires_grad_(), k[0, :13].detach().requires_grad_()
    assert_autograd_routes_agree(
        lambda: kernel.flash_attn_varlen_func(qp, kp, kp, cu, cu, 7, 7, deterministic=True),
        (qp, kp),
        "AttnFuncEager",
    )


def test_varlen_backward_and_paged_raises(kernel, device):
    dtype = kernel_dtype(device)
    lens = [7, 12]
    cu = cu_seqlens(lens, device)
    q = randn((19, 2, 8), dtype, device, seed=20).requires_grad_()
    k = randn((19, 2, 8), dtype, device, seed=21).requires_grad_()
    out = kernel.flash_attn_varlen_func(q, k, k, cu, cu, 12, 12, causal=True)
    out.sum().backward()
    assert q.grad is not None and bool(torch.isfinite(k.grad).all())
    # paged K/V (a block table) is inference-only
    cache = randn((4, 16, 2, 8), dtype, device, seed=22).requires_grad_()
    table = torch.tensor([[0], [1]], dtype=torch.int32, device=device)
    out = kernel.flash_attn_varlen_func(
        q, cache, cache, cu, cu, 12, 12, causal=True, block_table=table
    )
    with pytest.raises(NotImplementedError, match="inference-only"):
        out.sum().backward()


class _BackwardRecorder:
    """An ops namespace that records the `deterministic` argument of each backward op called
    through it (attn_bwd's last; bwd / varlen_bwd's before gen and rng_state) and runs the op."""

    def __init__(self, ops):
        self._ops, self.calls = ops, []

    def __getattr__(self, name):
        op = getattr(self._ops, name)
        if name not in ("attn_bwd", "bwd", "varlen_bwd"):
            return op

        def record(*args):
            self.calls.append((name, args[-1] if name == "attn_bwd" else args[-3]))
            return op(*args)

        return record


def test_deterministic_reaches_the_backward(kernel, device, monkeypatch):
    """`deterministic` of the public functions (default False, flash-attn's) reaches attn_bwd
    through autograd, for the dense, varlen and packed forms and transformers' entry point (where
    FLASH_ATTENTION_DETERMINISTIC=1 stands in for an absent keyword, as in transformers), and
    that of the low-level varlen backward reaches varlen_bwd. Checked at the op call, since the
    CPU computes the same either way."""
    recorder = _BackwardRecorder(kernel._custom_ops.ops)
    monkeypatch.setattr(kernel._custom_ops, "ops", recorder)
    monkeypatch.setattr(kernel.flash_attn_interface, "ops", recorder)
    monkeypatch.delenv("FLASH_ATTENTION_DETERMINISTIC", raising=False)
    dtype = kernel_dtype(device)
    q = randn((1, 9, 4, 16), dtype, device, seed=23).requires_grad_()
    k = randn((1, 9, 2, 16), dtype, device, seed=24).requires_grad_()
    qp = randn((9, 4, 16), dtype, device, seed=25).requires_grad_()
    kp = randn((9, 2, 16), dtype, device, seed=26).requires_grad_()
    qkv = randn((1, 9, 3, 2, 16), dtype, device, seed=27).requires_grad_()
    cu = cu_seqlens([4, 5], device)
    opts = dict(scale=0.25, causal=False, window=(-1, -1), softcap=0.0, slopes=None)
    out, lse = forward(kernel, qp.detach(), kp.detach(), kp.detach(), opts, cu, cu, 5, 5)
    low = (qp.detach(), kp.detach(), kp.detach(), out, lse, None, None, None, cu, cu, 5, 5)

    def recorded(run):
        """The (op, deterministic) of the one backward op that `run` calls."""
        recorder.calls.clear()
        run()
        assert len(recorder.calls) == 1, recorder.calls
        return recorder.calls[0]

    for det in (None, False, True):
        kw = {} if det is None else dict(deterministic=det)
        for fn, args in (
            (kernel.flash_attn_func, (q, k, k)),
            (kernel.flash_attn_varlen_func, (qp, kp, kp, cu, cu, 5, 5)),
            (kernel.flash_attn_qkvpacked_func, (qkv,)),
        ):
            got = recorded(lambda: fn(*args, **kw).sum().backward())
            assert got == ("attn_bwd", bool(det)), (fn.__name__, kw)
        varlen_bwd = kernel.flash_attn_interface._flash_attn_varlen_backward
        got = recorded(lambda: varlen_bwd(torch.ones_like(out), *low, 0.0, None, False, **kw))
        assert got == ("varlen_bwd", bool(det)), kw

    # transformers' layout [B, H, S, D]; `deterministic` among the keyword arguments, else the
    # environment variable transformers reads
    tq, tk = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k))

    def transformers_call(**kw):
        fwd = kernel.transformers_attention_forward
        return recorded(
            lambda: fwd(None, tq, tk, tk, None, is_causal=True, **kw)[0].sum().backward()
        )

    assert transformers_call() == ("attn_bwd", False)
    assert transformers_call(deterministic=True) == ("attn_bwd", True)
    monkeypatch.setenv("FLASH_ATTENTION_DETERMINISTIC", "1")
    assert transformers_call() == ("attn_bwd", True)
    assert transformers_call(deterministic=False) == ("attn_bwd", False)


# ---- flash-attn's low-level backward ----


def test_low_level_backward_is_attn_bwd(kernel, device):
    """_flash_attn_backward / _flash_attn_varlen_backward (flash-attn 2.8's parameters) and the C++
    ops bwd / varlen_bwd under them: attn_bwd's gradients bit for bit, written into the given dq /
    dk / dv (or new tensors), and softmax_d = rowsum(dout * out) laid out as softmax_lse."""
    iface = kernel.flash_attn_interface
    dtype = torch.bfloat16
    slopes = alibi_slopes(4, device)
    q = randn((2, 13, 4, 16), dtype, device, seed=30)
    k = randn((2, 17, 2, 16), dtype, device, seed=31)
    v = randn((2, 17, 2, 16), dtype, device, seed=32)
    dout = randn((2, 13, 4, 16), dtype, device, seed=33)
    opts = dict(scale=0.3, causal=True, window=(5, -1), softcap=3.0, slopes=slopes)
    out, lse = forward(kernel, q, k, v, opts)
    want = backward(kernel, dout, q, k, v, out, lse, opts)
    given = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    softmax_d = iface._flash_attn_backward(
        dout, q, k, v, out, lse, *given, 0.0, 0.3, True, 5, -1, 3.0, slopes, True
    )
    for got, w in zip(given, want):
        assert torch.equal(got, w)
    rowsum = (dout.double() * out.double()).sum(-1).transpose(1, 2)  # [B, H, S_q]
    assert softmax_d.dtype == torch.float32 and softmax_d.shape == lse.shape
    torch.testing.assert_close(softmax_d.double(), rowsum, rtol=1e-5, atol=1e-5)
    new = kernel.ops.bwd(
        dout,
        q,
        k,
        v,
        out,
        lse,
        None,
        None,
        None,
        slopes,
        0.0,
        0.3,
        True,
        5,
        -1,
        3.0,
        True,
        None,
        None,
    )
    assert all(torch.equal(got, w) for got, w in zip(new[:3], want))

    lens = [6, 11]
    cu = cu_seqlens(lens, device)
    qp = randn((17, 4, 16), dtype, device, seed=34)
    kp = randn((17, 2, 16), dtype, device, seed=35)
    dp = randn((17, 4, 16), dtype, device, seed=36)
    plain = dict(scale=16**-0.5, causal=False, window=(-1, -1), softcap=0.0, slopes=None)
    sizes = (cu, cu, 11, 11)
    out, lse = forward(kernel, qp, kp, kp, plain, *sizes)
    want = backward(kernel, dp, qp, kp, kp, out, lse, plain, *sizes)
    given = [torch.full_like(t, float("nan")) for t in (qp, kp, kp)]
    softmax_d = iface._flash_attn_varlen_backward(
        dp, qp, kp, kp, out, lse, *given, cu, cu, 11, 11, 0.0, None, False, deterministic=True
    )
    for got, w in zip(given, want):
        assert torch.equal(got, w)
    assert softmax_d.shape == lse.shape  # [H, total_q]
    rowsum = (dp.double() * out.double()).sum(-1).t()
    torch.testing.assert_close(softmax_d.double(), rowsum, rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError, match="varlen_bwd: dropout"):
        iface._flash_attn_varlen_backward(
            dp, qp, kp, kp, out, lse, None, None, None, cu, cu, 11, 11, 0.2, None, False
        )


def test_opcheck_low_level_backward(kernel, device):
    """bwd and varlen_bwd: schema, fake kernel and AOT dispatch (gradients allocated by the op)."""
    dtype = kernel_dtype(device)
    q = randn((2, 9, 4, 16), dtype, device, seed=37)
    k = randn((2, 12, 2, 16), dtype, device, seed=38)
    opts = dict(scale=0.25, causal=True, window=(-1, -1), softcap=0.0, slopes=None)
    out, lse = forward(kernel, q, k, k, opts)
    dense = (torch.randn_like(out), q, k, k, out, lse, None, None, None, None, 0.0, 0.25, True)
    torch.library.opcheck(kernel.ops.bwd.default, dense + (-1, -1, 0.0, False, None, None))
    cu = cu_seqlens([4, 9], device)
    qp, kp = (
        randn((13, 4, 16), dtype, device, seed=39),
        randn((13, 2, 16), dtype, device, seed=40),
    )
    out, lse = forward(kernel, qp, kp, kp, opts, cu, cu, 9, 9)
    varlen = (torch.randn_like(out), qp, kp, kp, out, lse, None, None, None, cu, cu, None, 9, 9)
    torch.library.opcheck(
        kernel.ops.varlen_bwd.default,
        varlen + (0.0, 0.25, False, True, -1, -1, 0.0, False, None, None),
    )


# ---- float64: exact enough for torch.autograd.gradcheck ----

FLOAT64_MODES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "window_softcap_alibi": dict(window_size=(2, 1), softcap=3.0, alibi=True),
}


@pytest.mark.parametrize("mode", list(FLOAT64_MODES))
def test_gradcheck_float64(kernel, device, mode):
    """torch.autograd.gradcheck through flash_attn_func in float64 (GQA 4/2, S_q != S_k): the
    numerical Jacobian of the forward against the backward; and the forward against the float64
    formula, since a forward and backward wrong alike would pass gradcheck."""
    if device != "cpu":
        pytest.skip("float64 runs on the CPU only")
    kw = dict(FLOAT64_MODES[mode])
    slopes = alibi_slopes(4, "cpu") if kw.pop("alibi", False) else None
    leaves = [
        randn(shape, torch.float64, "cpu", seed=41 + i).requires_grad_()
        for i, shape in enumerate([(2, 5, 4, 8), (2, 7, 2, 8), (2, 7, 2, 8)])
    ]

    def attend(q, k, v):
        return kernel.flash_attn_func(q, k, v, alibi_slopes=slopes, **kw)

    assert torch.autograd.gradcheck(attend, leaves)
    window = kw.get("window_size", (-1, -1))
    opts = dict(
        scale=float(torch.tensor(8**-0.5, dtype=torch.float32)),  # the kernels take it in float32
        causal=kw.get("causal", False),
        window=window,
        softcap=kw.get("softcap", 0.0),
        slopes=slopes,
    )
    out = attend(*leaves).detach()
    for b in range(2):
        want = formula(*(t[b].detach() for t in leaves), **opts)
        torch.testing.assert_close(out[b], want, rtol=1e-12, atol=1e-12)


def test_gradcheck_float64_varlen(kernel, device):
    if device != "cpu":
        pytest.skip("float64 runs on the CPU only")
    cu = cu_seqlens([3, 5], "cpu")
    leaves = [
        randn((8, h, 8), torch.float64, "cpu", seed=45 + i).requires_grad_()
        for i, h in enumerate((4, 2, 2))
    ]
    assert torch.autograd.gradcheck(
        lambda q, k, v: kernel.flash_attn_varlen_func(q, k, v, cu, cu, 5, 5, causal=True), leaves
    )


def test_bwd_strided_views(kernel, device):
    """q, k, v, out and dout as views whose rows are not 16-byte multiples (CUDA reads them through
    copies) and dq / dk / dv as such views (CUDA writes them through temporaries): attn_bwd's
    gradients of the contiguous tensors, bit for bit, and nothing outside the views written."""
    dtype = kernel_dtype(device, torch.bfloat16)
    opts = dict(scale=0.2, causal=True, window=(-1, -1), softcap=0.0, slopes=None)

    def view(shape, seed):  # [.., 24] of a [.., 28] buffer: rows of 56 bytes
        return randn((*shape[:-1], 28), dtype, device, seed=seed)[..., :24]

    q, k, v = view((2, 70, 4, 24), 50), view((2, 90, 2, 24), 51), view((2, 90, 2, 24), 52)
    dout = view((2, 70, 4, 24), 53)
    out, lse = forward(kernel, q, k, v, opts)
    want = backward(
        kernel, dout.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), out, lse, opts
    )
    buffers = [torch.full((*t.shape[:-1], 28), 7.0, dtype=dtype, device=device) for t in (q, k, v)]
    grads_ = [b[..., :24] for b in buffers]
    kernel.ops.attn_bwd(
        *grads_, dout, q, k, v, out, lse, None, None, None, 0, 0, *scalars(opts), True
    )
    for got, w, b in zip(grads_, want, buffers):
        assert torch.equal(got, w)
        assert bool((b[..., 24:] == 7.0).all())
