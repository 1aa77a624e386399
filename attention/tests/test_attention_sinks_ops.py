"""Attention sinks (FA3's ``s_aux``, gpt-oss's ``sinks``): one logit per query head that joins every
row's softmax and carries no value. Forward (dense, varlen, KV cache, paged, split-KV) against a
float64 reference with the sink as an extra score column; lse against the reference's logsumexp
including the sink; dq, dk, dv and d s_aux against float64 autograd (twice PyTorch's autograd
error in the dtype plus a floor, as in test_attention_bwd_ops); torch.compile; bad input.

The forward's bound is attention_cases' error model (twice PyTorch's own error in the dtype, here
SDPA with the sink as a zero key whose mask entry is the sink logit, plus the floor) plus half a
unit in the last place of the dtype at the largest |out|: the kernels round out without the sink
to the dtype, and the sink's float32 rescale (with_sinks) rounds it once more. That extra
rounding is the price of applying the sink outside the kernels (NOTES: attention sinks)."""

import math

import pytest
import torch
import torch.nn.functional as F
from attention_cases import (
    FLOOR,
    LSE_TOL,
    UNIT,
    cu_seqlens,
    dtype_id,
    dtypes_for,
    heads_first,
    paged_cache,
    randn,
    scores,
    visible,
)


def sink_formula(q, k, v, sinks, scale, causal=False, window=(-1, -1), softcap=0.0):
    """One sequence in q's dtype, differentiable: q [S_q, H, D], k / v [S_k, H_kv, D], sinks [H]
    -> (out [S_q, H, D], lse [H, S_q]). The sink is an extra score column with no value."""
    (sq, h, _), sk = q.shape, k.shape[0]
    s, vt = scores(q, k, v, scale, softcap)
    s = s.masked_fill(~visible(sq, sk, causal, window).to(s.device), float("-inf"))
    s = torch.cat([s, sinks.to(s.dtype).view(h, 1, 1).expand(h, sq, 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1)[..., :-1]
    return (p @ vt).transpose(0, 1), lse


def sdpa_sinks(q, k, v, sinks, scale, causal=False, window=(-1, -1), softcap=0.0):
    """PyTorch's own result in q's dtype: SDPA over the keys plus a zero key and value whose mask
    entry is the sink (score 0 + sink); with softcap, which SDPA lacks, the formula op by op."""
    if softcap:
        return sink_formula(q, k, v, sinks, scale, causal, window, softcap)[0]
    sq, h, d = q.shape
    sk = k.shape[0]
    qt, kt, vt = heads_first(q, k, v)
    zero = kt.new_zeros(h, 1, d)
    mask = torch.zeros(h, sq, sk + 1, dtype=q.dtype, device=q.device)
    hidden = ~visible(sq, sk, causal, window).to(q.device)
    mask[:, :, :sk] = mask[:, :, :sk].masked_fill(hidden, float("-inf"))
    mask[:, :, sk] = sinks.to(q.dtype).view(h, 1)
    out = F.scaled_dot_product_attention(
        qt, torch.cat([kt, zero], 1), torch.cat([vt, zero], 1), attn_mask=mask, scale=scale
    )
    return out.transpose(0, 1)


def check_sequence(out, lse, q, k, v, sinks, what, **opts):
    """out [S_q, H, D] and lse [H, S_q] of one sequence against the float64 reference."""
    ref_out, ref_lse = sink_formula(*(t.detach().cpu().double() for t in (q, k, v, sinks)), **opts)
    theirs = sdpa_sinks(q.detach(), k.detach(), v.detach(), sinks.detach(), **opts)
    ours = out.detach().cpu().double()
    assert torch.isfinite(ours).all(), f"{what}: non-finite output"
    err = (ours - ref_out).abs().max().item() if ours.numel() else 0.0
    err_pt = (theirs.cpu().double() - ref_out).abs().max().item() if ours.numel() else 0.0
    floor = FLOOR * (v.abs().max().item() if v.numel() else 0.0)
    biggest = ref_out.abs().max().item() if ref_out.numel() else 0.0
    rescale = 0.5 * ulp_at_one(out.dtype) * 2.0 ** math.floor(math.log2(biggest or 1.0))
    assert err <= 2 * err_pt + floor + rescale, (
        f"{what}: error {err:.3g}, PyTorch's {err_pt:.3g} (+ rescale rounding {rescale:.3g})"
    )
    if lse is not None:
        diff = (lse.detach().cpu().double() - ref_lse).abs()
        tol = LSE_TOL * (1 + ref_lse.abs())
        assert bool((diff <= tol).all()), f"{what}: lse error {diff.max().item():.3g}"


def ulp_at_one(dtype):
    """The spacing of `dtype` in [1, 2) (one unit in the last place at 1)."""
    return torch.finfo(dtype).eps


def sinks_for(heads, device, seed=5):
    # Logits of the scores' size, some above the largest score so that the sink dominates rows.
    return randn((heads,), torch.float32, device, seed=seed, scale=2.0)


# (S_q, S_k, H, H_kv, D, causal, window, softcap)
DENSE = [
    (37, 37, 4, 4, 64, False, (-1, -1), 0.0),
    (37, 53, 4, 2, 64, True, (-1, -1), 0.0),  # GQA
    (45, 20, 2, 1, 128, True, (-1, -1), 0.0),  # more queries than keys: rows with the sink alone
    (64, 64, 4, 4, 64, False, (8, 0), 0.0),  # gpt-oss's sliding window layers
    (30, 30, 2, 2, 32, True, (-1, -1), 5.0),
]


@pytest.mark.parametrize("case", DENSE, ids=lambda c: "-".join(map(str, c[:5])))
def test_sinks_forward_dense(kernel, device, case):
    sq, sk, h, hk, d, causal, window, softcap = case
    opts = dict(scale=d**-0.5, causal=causal, window=window, softcap=softcap)
    for dtype in dtypes_for(device):
        q = randn((2, sq, h, d), dtype, device, seed=1)
        k = randn((2, sk, hk, d), dtype, device, seed=2)
        v = randn((2, sk, hk, d), dtype, device, seed=3)
        sinks = sinks_for(h, device)
        out, lse, _ = kernel.flash_attn_func(
            q,
            k,
            v,
            causal=causal,
            window_size=window,
            softcap=softcap,
            s_aux=sinks,
            return_attn_probs=True,
        )
        for b in range(2):
            check_sequence(
                out[b], lse[b], q[b], k[b], v[b], sinks, f"{dtype_id(dtype)} batch {b}", **opts
            )


def test_sinks_forward_varlen(kernel, device):
    """Packed sequences, one without queries and one without keys; sinks in bfloat16 (the
    dtype of gpt-oss's parameter)."""
    lens_q, lens_k = [5, 0, 33, 17, 9], [5, 12, 40, 0, 70]
    h, hk, d = 4, 2, 64
    for dtype in dtypes_for(device):
        q = randn((sum(lens_q), h, d), dtype, device, seed=11)
        k = randn((sum(lens_k), hk, d), dtype, device, seed=12)
        v = randn((sum(lens_k), hk, d), dtype, device, seed=13)
        sinks = sinks_for(h, device).to(torch.bfloat16)
        cu_q, cu_k = cu_seqlens(lens_q, device), cu_seqlens(lens_k, device)
        out, lse, _ = kernel.flash_attn_varlen_func(
            q,
            k,
            v,
            cu_q,
            cu_k,
            max(lens_q),
            max(lens_k),
            causal=True,
            s_aux=sinks,
            return_attn_probs=True,
        )
        for i in range(len(lens_q)):
            rq = slice(int(cu_q[i]), int(cu_q[i + 1]))
            rk = slice(int(cu_k[i]), int(cu_k[i + 1]))
            check_sequence(
                out[rq],
                lse[:, rq],
                q[rq],
                k[rk],
                v[rk],
                sinks,
                f"{dtype_id(dtype)} sequence {i}",
                scale=d**-0.5,
                causal=True,
            )


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("num_splits", [1, 4])
def test_sinks_kvcache(kernel, device, layout, num_splits):
    """Decode and a chunk of new queries over a cache (split-KV on CUDA with num_splits 4: the sink
    joins once, after the splits are combined)."""
    h, hk, d = 8, 2, 64
    lens = [300, 17, 1]
    dtype = dtypes_for(device)[-1]
    for sq in (1, 3):
        q = randn((len(lens), sq, h, d), dtype, device, seed=21)
        ks = [randn((n, hk, d), dtype, device, seed=22 + i) for i, n in enumerate(lens)]
        vs = [randn((n, hk, d), dtype, device, seed=32 + i) for i, n in enumerate(lens)]
        sinks = sinks_for(h, device)
        table = None
        if layout == "paged":
            k_cache, v_cache, table = paged_cache(ks, vs, 16, seed=40)
        else:
            width = max(lens)
            k_cache = torch.zeros((len(lens), width, hk, d), dtype=dtype, device=device)
            v_cache = torch.zeros_like(k_cache)
            for i, n in enumerate(lens):
                k_cache[i, :n], v_cache[i, :n] = ks[i], vs[i]
        seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
        out, lse = kernel.flash_attn_with_kvcache(
            q,
            k_cache,
            v_cache,
            cache_seqlens=seqlens,
            block_table=table,
            causal=True,
            num_splits=num_splits,
            s_aux=sinks,
            return_softmax_lse=True,
        )
        for i in range(len(lens)):
            check_sequence(
                out[i],
                lse[i],
                q[i],
                ks[i],
                vs[i],
                sinks,
                f"S_q {sq} sequence {i}",
                scale=d**-0.5,
                causal=True,
            )


def sink_grads(q, k, v, sinks, dout, dtype, **opts):
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v, sinks)]
    out, _ = sink_formula(*leaves, **opts)
    out.backward(dout.to(dtype))
    return [t.grad.double() for t in leaves]


@pytest.mark.parametrize(
    "case",
    [
        (40, 40, 4, 2, 64, True, (-1, -1)),
        (33, 50, 2, 2, 128, False, (-1, -1)),
        (48, 48, 4, 4, 64, True, (6, 0)),
    ],
    ids=lambda c: "-".join(map(str, c[:5])),
)
def test_sinks_backward(kernel, device, case):
    """dq, dk, dv and d s_aux through flash_attn_func, one sequence, against float64 autograd."""
    sq, sk, h, hk, d, causal, window = case
    opts = dict(scale=d**-0.5, causal=causal, window=window)
    for dtype in dtypes_for(device):
        q = randn((1, sq, h, d), dtype, device, seed=51).requires_grad_()
        k = randn((1, sk, hk, d), dtype, device, seed=52).requires_grad_()
        v = randn((1, sk, hk, d), dtype, device, seed=53).requires_grad_()
        sinks = sinks_for(h, device).requires_grad_()
        dout = randn((1, sq, h, d), dtype, device, seed=54)
        out = kernel.flash_attn_func(
            q, k, v, causal=causal, window_size=window, s_aux=sinks, deterministic=True
        )
        got = torch.autograd.grad(out, (q, k, v, sinks), dout)
        args = [t.detach()[0].cpu() for t in (q, k, v, dout)]
        exact = sink_grads(*args[:3], sinks.detach().cpu(), args[3], torch.float64, **opts)
        theirs = sink_grads(*args[:3], sinks.detach().cpu(), args[3], dtype, **opts)
        for name, g, want, pt in zip(("dq", "dk", "dv", "ds_aux"), got, exact, theirs):
            g = g.detach().cpu().double()
            g = g if name == "ds_aux" else g[0]
            floor = 8 * UNIT[dtype] * float(want.abs().max())
            err = float((g - want).abs().max())
            pt_err = float((pt - want).abs().max())
            assert err <= 2 * pt_err + floor, (
                f"{dtype_id(dtype)} {name}: error {err:.3g}, PyTorch's {pt_err:.3g}"
            )


def test_sinks_varlen_backward_reaches_every_sequence(kernel, device):
    """d s_aux sums over the packed rows of every sequence: the sum of per-sequence calls."""
    lens = [7, 20, 3]
    h, d = 2, 64
    dtype = dtypes_for(device)[-1]
    q = randn((sum(lens), h, d), dtype, device, seed=61)
    k = randn((sum(lens), h, d), dtype, device, seed=62)
    v = randn((sum(lens), h, d), dtype, device, seed=63)
    sinks = sinks_for(h, device).requires_grad_()
    cu = cu_seqlens(lens, device)
    out = kernel.flash_attn_varlen_func(
        q, k, v, cu, cu, max(lens), max(lens), causal=True, s_aux=sinks
    )
    (packed,) = torch.autograd.grad(out.float().sum(), sinks)
    total = torch.zeros_like(packed)
    for i in range(len(lens)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        o = kernel.flash_attn_func(
            q[None, rows], k[None, rows], v[None, rows], causal=True, s_aux=sinks
        )
        total += torch.autograd.grad(o.float().sum(), sinks)[0]
    torch.testing.assert_close(packed, total, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_sinks_compile_with_gradients(kernel, device):
    """flash_attn_func with s_aux compiles whole (fullgraph), forward and backward, and gives
    eager's output and gradients."""
    torch._dynamo.reset()
    dtype = dtypes_for(device)[-1]
    q = randn((1, 9, 4, 64), dtype, device, 1).requires_grad_()
    k = randn((1, 9, 2, 64), dtype, device, 2)
    sinks = sinks_for(4, device).requires_grad_()

    def f(q, k, sinks):
        return kernel.flash_attn_func(q, k, k, causal=True, s_aux=sinks, deterministic=True)

    out = torch.compile(f, fullgraph=True)(q, k, sinks)
    compiled = torch.autograd.grad(out.float().sum(), (q, sinks))
    eager_out = f(q, k, sinks)
    eager = torch.autograd.grad(eager_out.float().sum(), (q, sinks))
    torch.testing.assert_close(out, eager_out, rtol=0, atol=0)
    torch.testing.assert_close(compiled[0], eager[0], rtol=0, atol=0)
    torch.testing.assert_close(compiled[1], eager[1], rtol=1e-5, atol=1e-6)


def test_sinks_errors_name_the_argument(kernel, device):
    dtype = dtypes_for(device)[-1]
    q = randn((1, 4, 4, 32), dtype, device, 1)
    with pytest.raises(ValueError, match=r"s_aux must have shape \[4\]"):
        kernel.flash_attn_func(q, q, q, s_aux=torch.zeros(2, device=device))
    with pytest.raises(ValueError, match=r"s_aux must have shape \[4\]"):
        kernel.flash_attn_func(q, q, q, s_aux=torch.zeros(1, 4, device=device))
    with pytest.raises(TypeError, match="s_aux must be a floating-point tensor"):
        kernel.flash_attn_func(q, q, q, s_aux=torch.zeros(4, dtype=torch.int32, device=device))
    with pytest.raises(TypeError, match="s_aux must be a tensor"):
        kernel.flash_attn_func(q, q, q, s_aux=[0.0] * 4)
    if device == "cuda":
        with pytest.raises(ValueError, match="s_aux is on cpu"):
            kernel.flash_attn_func(q, q, q, s_aux=torch.zeros(4))
    seqlens = torch.full((1,), 4, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"flash_attn_with_kvcache: s_aux must have shape"):
        kernel.flash_attn_with_kvcache(q, q, q, cache_seqlens=seqlens, s_aux=torch.zeros(3))


def test_opcheck_attn_func_with_sinks(kernel, device):
    """torch.library.opcheck of the allocating op with s_aux: schema, fake, autograd registration
    and AOT dispatch, with q, k and s_aux requiring grad (the formula's d s_aux included) and
    without."""
    dtype = dtypes_for(device)[-1]
    q = randn((2, 6, 4, 32), dtype, device, 1)
    k = randn((2, 6, 2, 32), dtype, device, 2)
    sinks = sinks_for(4, device)
    head = (None,) * 7 + (0, 0, 0.2, 0.0, True, -1, -1, 0, None, True)
    for grad in (True, False):
        leaves = [t.detach().requires_grad_(grad) for t in (q, k, sinks)]
        args = (leaves[0], leaves[1], leaves[1], *head, leaves[2])
        torch.library.opcheck(kernel.ops.attn_func.default, args)
