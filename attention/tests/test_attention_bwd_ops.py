"""The attention backward (attn_bwd; the CPU kernel, and on a CUDA build the mma.sync kernels): dq, dk, dv against float64 autograd of the reference
formula, for every mode the forward has (causal, sliding window, softcap, ALiBi, MQA / GQA,
S_q != S_k, rows that see no key, varlen). The error bound is twice that of PyTorch's own
autograd of the same formula in the input dtype against float64 (the issue's "2x SDPA's own
gradient error"), plus a floor of 8 units of roundoff of the largest gradient."""

import pytest
import torch
from attention_cases import (
    alibi_slopes,
    bias,
    cu_seqlens,
    dtype_id,
    randn,
    visible,
)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
UNIT = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


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
    sq, h, _ = q.shape
    sk, hk, _ = k.shape
    qt = q.transpose(0, 1)
    kt = k.repeat_interleave(h // hk, dim=1).transpose(0, 1)
    vt = v.repeat_interleave(h // hk, dim=1).transpose(0, 1)
    s = (qt @ kt.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
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


def backward(kernel, dout, q, k, v, out, lse, opts, cu_q=None, cu_k=None, max_q=0, max_k=0):
    """(dq, dk, dv) of attn_bwd, each written into a NaN-filled tensor (an element it leaves
    unwritten fails the comparison)."""
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
    # Several 64-row blocks of queries and keys (the CUDA kernels' tiles), head dims up to 128.
    (150, 150, 4, 2, 64, True, (-1, -1), 0.0, False),
    (130, 200, 4, 1, 128, False, (70, 10), 0.0, False),
    (200, 90, 2, 2, 96, True, (-1, -1), 0.0, False),
    (129, 129, 4, 2, 128, True, (-1, -1), 20.0, True),
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


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_bwd_against_float64_autograd(kernel, device, dtype, case):
    cpu_only_dtype(device, dtype)
    sq, sk, h, hk, d, causal, window, cap, alibi = case
    batch = 2
    q = randn((batch, sq, h, d), dtype, device, seed=sq + h)
    k = randn((batch, sk, hk, d), dtype, device, seed=sk + hk + 1)
    v = randn((batch, sk, hk, d), dtype, device, seed=sk + d + 2)
    dout = randn((batch, sq, h, d), dtype, device, seed=3)
    slopes = alibi_slopes(h, device) if alibi else None
    opts = dict(scale=d**-0.5, causal=causal, window=window, softcap=cap, slopes=slopes)
    out, lse = forward(kernel, q, k, v, opts)
    dq, dk, dv = backward(kernel, dout, q, k, v, out, lse, opts)
    for b in range(batch):
        assert_grads((dq[b], dk[b], dv[b]), q[b], k[b], v[b], dout[b], dtype, f"batch {b}", **opts)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_bwd_varlen(kernel, device, dtype):
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
    dq, dk, dv = backward(kernel, dout, q, k, v, out, lse, opts, *sizes)
    for i in range(len(lens_q)):
        rq = slice(int(cu_q[i]), int(cu_q[i + 1]))
        rk = slice(int(cu_k[i]), int(cu_k[i + 1]))
        assert_grads(
            (dq[rq], dk[rk], dv[rk]), q[rq], k[rk], v[rk], dout[rq], dtype, f"seq {i}", **opts
        )
    assert not dq[sum(lens_q) :].any() and not dk[sum(lens_k) :].any()
    assert not dv[sum(lens_k) :].any()


def test_bwd_is_deterministic(kernel, device):
    """Tasks (CPU) and CTAs (CUDA) own disjoint rows, with no atomics: the same bits on every
    run, whatever the thread count."""
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
def test_pipelined_bwd_matches_single_stage(kernel, device, case, monkeypatch):
    """CUDA: the pipelined kernels (ATTENTION_BWD_STAGES=2, off by default until this passes on a
    GPU) do the single-stage kernels' math in the same order, so every gradient is equal bit for
    bit, for each mode, head dim and length off the 64-row tiles; varlen too. With dQ added by
    atomics (ATTENTION_BWD_ATOMIC_DQ=1), dK and dV are still those bits and dQ, whose sums run
    in a varying order, is within the float64 bound of the other tests."""
    if device != "cuda":
        pytest.skip("the stages are the CUDA kernels'")
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
    runs = {}
    for variant, stages, atomic in (
        ("single", "1", "0"),
        ("pipelined", "2", "0"),
        ("atomic", "2", "1"),
    ):
        monkeypatch.setenv("ATTENTION_BWD_STAGES", stages)
        monkeypatch.setenv("ATTENTION_BWD_ATOMIC_DQ", atomic)
        dense = backward(kernel, dout, q, k, v, out, lse, opts)
        packed = backward(kernel, pdout, pq, pk, pv, pout, plse, opts, *sizes)
        runs[variant] = (*dense, *packed)
    names = ("dq", "dk", "dv", "varlen dq", "varlen dk", "varlen dv")
    for name, one, two, three in zip(names, runs["single"], runs["pipelined"], runs["atomic"]):
        assert not two.isnan().any() and not three.isnan().any(), f"{name}: left unwritten"
        assert torch.equal(one, two), f"{name}: pipelined differs"
        if "dq" not in name:
            assert torch.equal(one, three), f"{name}: atomic-dQ variant differs"
    dq, dk, dv, pdq, pdk, pdv = runs["atomic"]
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
    softcap and ALiBi, and varlen without."""
    slopes = alibi_slopes(4, device)
    cu = cu_seqlens([4, 9], device)
    dtype = kernel_dtype(device)
    cases = [  # (q, k, options, (cu_q, cu_k, max_q, max_k))
        (
            randn((2, 9, 4, 16), dtype, device, seed=11),
            randn((2, 12, 2, 16), dtype, device, seed=12),
            dict(scale=0.25, causal=True, window=(-1, -1), softcap=2.0, slopes=slopes),
            (None, None, 0, 0),
        ),
        (
            randn((13, 4, 16), dtype, device, seed=13),
            randn((13, 2, 16), dtype, device, seed=14),
            dict(scale=0.25, causal=False, window=(-1, -1), softcap=0.0, slopes=None),
            (cu, cu, 9, 9),
        ),
    ]
    for q, k, opts, sizes in cases:
        out, lse = forward(kernel, q, k, k, opts, *sizes)
        cu_q, cu_k, max_q, max_k = sizes
        args = (
            torch.empty_like(q),
            torch.empty_like(k),
            torch.empty_like(k),
            torch.randn_like(out),
        )
        args += (q, k, k, out, lse, cu_q, cu_k, opts["slopes"], max_q, max_k, *scalars(opts))
        torch.library.opcheck(kernel.ops.attn_bwd.default, args)


# ---- through autograd: the public functions ----


def test_flash_attn_func_backward_is_attn_bwd(kernel, device):
    """loss.backward() through flash_attn_func (softcap, window, ALiBi, GQA) gives attn_bwd's
    gradients bit for bit, and through the qkv-packed form the sum of its three slices."""
    dtype = torch.bfloat16
    q = randn((2, 21, 4, 16), dtype, device, seed=15).requires_grad_()
    k = randn((2, 30, 2, 16), dtype, device, seed=16).requires_grad_()
    v = randn((2, 30, 2, 16), dtype, device, seed=17).requires_grad_()
    dout = randn((2, 21, 4, 16), dtype, device, seed=18)
    slopes = alibi_slopes(4, device)
    kw = dict(causal=True, window_size=(6, -1), softcap=4.0, alibi_slopes=slopes)
    kernel.flash_attn_func(q, k, v, **kw).backward(dout)
    opts = dict(scale=16**-0.5, causal=True, window=(6, -1), softcap=4.0, slopes=slopes)
    qd, kd, vd = (t.detach() for t in (q, k, v))
    out, lse = forward(kernel, qd, kd, vd, opts)
    want = backward(kernel, dout, qd, kd, vd, out, lse, opts)
    for got, w in zip((q.grad, k.grad, v.grad), want):
        assert torch.equal(got, w)

    qkv = randn((1, 12, 3, 2, 16), dtype, device, seed=19).requires_grad_()
    kernel.flash_attn_qkvpacked_func(qkv, causal=True).sum().backward()
    parts = [t.detach() for t in qkv.unbind(2)]
    plain = dict(scale=16**-0.5, causal=True, window=(-1, -1), softcap=0.0, slopes=None)
    out, lse = forward(kernel, *parts, plain)
    want = backward(kernel, torch.ones_like(out), *parts, out, lse, plain)
    assert torch.equal(qkv.grad, torch.stack(want, dim=2))


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
        False,
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
        dp, qp, kp, kp, out, lse, *given, cu, cu, 11, 11, 0.0, None, False
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
    kernel.ops.attn_bwd(*grads_, dout, q, k, v, out, lse, None, None, None, 0, 0, *scalars(opts))
    for got, w, b in zip(grads_, want, buffers):
        assert torch.equal(got, w)
        assert bool((b[..., 24:] == 7.0).all())
