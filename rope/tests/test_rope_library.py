"""torch.library conformance of the rope ops: opcheck, torch.compile parity, no recompiles.

`opcheck` runs on every C++ op (in place on views of a fused qkv buffer, out-param, each
optional argument present and absent): schema (mutation annotations), fake kernel, autograd
registration and AOT dispatch with static and dynamic shapes. Compiled (fullgraph) forward and
backward graphs must equal eager bit for bit, since both run the same opaque kernels;
`fullgraph=True` turns any graph break into an error.
"""

import pytest
import torch
import torch.nn as nn
from rope_cases import (
    BF16,
    F32,
    dtype_id,
    make_cos_sin,
    make_cos_sin_cache,
    make_input,
    make_positions,
)

HQ, HK = 4, 2


def _opcheck(op, args):
    torch.library.opcheck(op, args)


def _fused(tokens, d, dtype, device, seed=0):
    buf = make_input((tokens, (HQ + 2 * HK) * d), dtype, device, seed=seed)
    return buf, buf[:, : HQ * d], buf[:, HQ * d : (HQ + HK) * d]


# ---- opcheck ----


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_id)
def test_opcheck_vllm_ops(kernel, device, dtype):
    ops = kernel.ops
    d, t = 16, 5
    for tdtype in (F32, dtype):
        cache = make_cos_sin_cache(32, 12, tdtype, device)  # partial rotary: 12 of 16
        positions = make_positions((t,), 32, torch.int64, device)
        for is_neox in (True, False):
            buf, q, k = _fused(t, d, dtype, device)
            _opcheck(ops.rotary_embedding.default, (positions, q, k, d, cache, is_neox))
            _opcheck(
                ops.rotary_embedding.default, (positions.int(), q.clone(), None, d, cache, is_neox)
            )
            q3 = make_input((2, 3, HQ, d), dtype, device)
            _opcheck(
                ops.rotary_embedding.default,
                (make_positions((2, 3), 32, torch.int32, device), q3, None, d, cache, is_neox),
            )
        offsets = make_positions((t,), 2, torch.int64, device, seed=1)
        big = make_cos_sin_cache(64, 12, tdtype, device)
        _opcheck(ops.batched_rotary_embedding.default, (positions, q, k, d, big, True, 12, offsets))


def _general_args(device, dtype, mode):
    b, s, d, rot = 2, 5, 16, 12
    q = make_input((b, s, HQ, d), dtype, device)
    k = make_input((b, s, HK, d), dtype, device, seed=1)
    cos, sin = make_cos_sin(24, rot // 2, F32, device)
    cos, sin = cos[None, :, None], sin[None, :, None]  # [1, R, 1, W]
    if mode == "positions":
        rows = dict(
            positions=make_positions((b, s), 24, torch.int64, device),
            seqlen_offsets=None,
            cu_seqlens=None,
            seqlen_offset=0,
        )
    elif mode == "sequence":
        rows = dict(
            positions=None,
            seqlen_offsets=torch.tensor([3, 1], dtype=torch.int32, device=device),
            cu_seqlens=None,
            seqlen_offset=2,
        )
    else:
        q, k = q.reshape(1, b * s, HQ, d), k.reshape(1, b * s, HK, d)
        rows = dict(
            positions=None,
            seqlen_offsets=torch.tensor([0, 4], dtype=torch.int32, device=device),
            cu_seqlens=torch.tensor([0, 4, 10], dtype=torch.int32, device=device),
            seqlen_offset=1,
        )
    tail = (
        rows["positions"],
        rows["seqlen_offsets"],
        rows["cu_seqlens"],
        rows["seqlen_offset"],
        rot,
    )
    return q, k, cos, sin, tail


@pytest.mark.kernels_ci
@pytest.mark.parametrize("mode", ["positions", "sequence", "varlen"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_id)
def test_opcheck_general_ops(kernel, device, dtype, mode):
    ops = kernel.ops
    q, k, cos, sin, tail = _general_args(device, dtype, mode)
    for interleaved, transpose in ((False, False), (True, True)):
        flags = (interleaved, False, transpose)
        _opcheck(ops.rope_inplace.default, (q.clone(), k.clone(), cos, sin, *tail, *flags))
        _opcheck(ops.rope_inplace.default, (q.clone(), None, cos, sin, *tail, *flags))
        _opcheck(
            ops.rope_out.default,
            (torch.empty_like(q), q, torch.empty_like(k), k, cos, sin, *tail, *flags),
        )
        _opcheck(
            ops.rope_out.default, (torch.empty_like(q), q, None, None, cos, sin, *tail, *flags)
        )
    # full per-channel table of width rot
    cf, sf = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    _opcheck(
        ops.rope_out.default,
        (torch.empty_like(q), q, torch.empty_like(k), k, cf, sf, *tail, False, True, False),
    )


@pytest.mark.kernels_ci
@pytest.mark.parametrize("mode", ["positions", "sequence", "varlen"])
def test_opcheck_functional_op(kernel, device, mode):
    # The allocating, differentiable custom op behind the Python API (autograd registered for
    # q, k, cos and sin), with and without k, half and full tables.
    q, k, cos, sin, tail = _general_args(device, F32, mode)
    q, k = q.requires_grad_(), k.requires_grad_()
    op = kernel.ops.rope_functional.default
    _opcheck(op, (q, k, cos, sin, *tail, False, False, False))
    _opcheck(op, (q, None, cos, sin, *tail, True, False, True))
    cf = torch.cat([cos, cos], -1).requires_grad_()
    sf = torch.cat([sin, sin], -1).requires_grad_()
    _opcheck(op, (q, k, cf, sf, *tail, False, True, False))


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_id)
def test_opcheck_apply_rotary(kernel, device, dtype):
    x = make_input((2, 3, 5, 16), dtype, device)
    cos, sin = make_cos_sin(5, 8, dtype, device)
    x1, x2 = x[..., :8], x[..., 8:]
    out = torch.empty_like(x)
    for conj in (False, True):
        _opcheck(
            kernel.ops.apply_rotary.default, (x1, x2, cos, sin, out[..., :8], out[..., 8:], conj)
        )
        # separate tensors (the ATen fallback)
        _opcheck(
            kernel.ops.apply_rotary.default,
            (
                x1.contiguous(),
                x2.contiguous(),
                cos,
                sin,
                torch.empty_like(x1.contiguous()),
                torch.empty_like(x1.contiguous()),
                conj,
            ),
        )


# ---- torch.compile ----


class Block(nn.Module):
    """An attention-input block that uses every differentiable functional form: flash-attn's
    apply_rotary_emb (per-batch offsets; interleaved), the transformers form (cos/sin require
    grad) and LTX-Video's per-channel form (its table built from the same cos/sin)."""

    def __init__(self, kernel):
        super().__init__()
        self.kernel = kernel

    def forward(self, qkv, cos_fa, sin_fa, offsets, cos, sin):
        k = self.kernel
        q, kk, v = qkv.unbind(2)  # [B, S, H, D] views of the packed projection
        heads = q.shape[2]
        q = k.apply_rotary_emb(q, cos_fa, sin_fa, seqlen_offsets=offsets)
        kk = k.apply_rotary_emb(kk, cos_fa, sin_fa, interleaved=True)
        q, kk = k.apply_rotary_transformers(q, kk, cos, sin, unsqueeze_dim=2)
        v = k.apply_rotary_emb_ltx(v.flatten(2), (cos.repeat(1, 1, heads), sin.repeat(1, 1, heads)))
        return q, kk, v


def _ints(shape, lo, hi, dtype, device, seed, scale=1.0):
    return (
        torch.randint(lo, hi + 1, shape, generator=torch.Generator().manual_seed(seed)) * scale
    ).to(device=device, dtype=dtype)


def _block_inputs(batch, seqlen, dtype, device, seed=0, heads=2, d=8, table_rows=None):
    """Small integers (activations, output gradients) and multiples of 1/4 (tables): every
    product and every sum the plain-PyTorch parts of the backward form (the cos/sin gradients,
    repeat's backward) is exact in fp32, so any summation order (eager, Inductor) gives the same
    bits and compiled == eager holds bit for bit for everything, not only for the kernels."""
    qkv = _ints((batch, seqlen, 3, heads, d), -3, 3, dtype, device, seed).requires_grad_()
    rows = table_rows or seqlen + 8
    cos_fa = _ints((rows, d // 2), -4, 4, dtype, device, seed + 1, 0.25)
    sin_fa = _ints((rows, d // 2), -4, 4, dtype, device, seed + 2, 0.25)
    offsets = torch.arange(batch, dtype=torch.int32, device=device) % 8
    cos = _ints((1, seqlen, d), -4, 4, dtype, device, seed + 3, 0.25).requires_grad_()
    sin = _ints((1, seqlen, d), -4, 4, dtype, device, seed + 4, 0.25).requires_grad_()
    return qkv, cos_fa, sin_fa, offsets, cos, sin


def _run(model, inputs, seed=3):
    outs = model(*inputs)
    grads_out = [_ints(t.shape, -2, 2, t.dtype, t.device, seed + i) for i, t in enumerate(outs)]
    leaves = [inputs[0], inputs[4], inputs[5]]
    grads = torch.autograd.grad(outs, leaves, grads_out)
    return [*outs, *grads]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_id)
def test_compile_parity(kernel, device, dtype):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = Block(kernel)
    inputs = _block_inputs(2, 7, dtype, device)
    eager = _run(model, inputs)
    compiled = _run(torch.compile(model, fullgraph=True), inputs)
    assert not torch._dynamo.utils.counters["graph_break"], dict(
        torch._dynamo.utils.counters["graph_break"]
    )
    for i, (a, b) in enumerate(zip(compiled, eager)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        assert torch.equal(a, b), f"output/gradient {i} differs between compiled and eager"


@pytest.mark.slow
def test_no_recompile_across_sizes(kernel, device):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = Block(kernel)
    compiled = torch.compile(model, fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for i, (batch, seqlen) in enumerate([(2, 5), (3, 9), (5, 13), (4, 6)]):
            inputs = _block_inputs(batch, seqlen, F32, device, seed=i, table_rows=24)
            qkv, cos_fa, sin_fa, offsets, cos, sin = inputs
            for t in (qkv, cos, sin):
                torch._dynamo.mark_dynamic(t, 1)
            torch._dynamo.mark_dynamic(qkv, 0)
            torch._dynamo.mark_dynamic(offsets, 0)
            got = _run(compiled, inputs)
            want = _run(model, inputs)
            for a, b in zip(got, want):
                assert torch.equal(a, b)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert frames == 1, f"expected one compiled graph for all sizes, got {frames}"


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_id)
def test_compile_in_place_ops(kernel, device, dtype):
    # The mutating ops under functionalization: the compiled function writes the caller's
    # tensors (views of a fused qkv buffer) exactly as eager does.
    torch._dynamo.reset()
    d = 16

    def step(qkv, positions, cache, x, cos, sin):
        q, k = qkv[:, : HQ * d], qkv[:, HQ * d : (HQ + HK) * d]
        kernel.rotary_embedding(positions, q, k, d, cache, True)
        kernel.apply_rope_with_cos_sin_cache_inplace(positions, q, k, d, cache, is_neox=False)
        kernel.apply_rotary_emb(x, cos, sin, inplace=True)
        return qkv + 1, x + 1

    t = 9
    qkv = make_input((t, (HQ + 2 * HK) * d), dtype, device)
    positions = make_positions((t,), 32, torch.int64, device)
    cache = make_cos_sin_cache(32, d, F32, device)
    x = make_input((2, t, HQ, d), dtype, device, seed=2)
    cos, sin = make_cos_sin(t, d // 2, dtype, device)
    args_e = [qkv.clone(), positions, cache, x.clone(), cos, sin]
    args_c = [qkv.clone(), positions, cache, x.clone(), cos, sin]
    ye = step(*args_e)
    yc = torch.compile(step, fullgraph=True)(*args_c)
    for a, b in zip(yc, ye):
        assert torch.equal(a, b)
    for a, b in zip(args_c, args_e):
        assert torch.equal(a, b)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("enable_pdl", [None, True, False], ids=str)
def test_enable_pdl_reaches_the_ops(kernel, device, enable_pdl):
    """enable_pdl is the last argument of every op (schema `bool? enable_pdl=None`), of
    rope_functional and of the Python functions; it changes how the CUDA kernel is launched,
    never the result (the CPU ignores it)."""
    ops = kernel.ops
    d, t = 16, 5
    cache = make_cos_sin_cache(32, 12, F32, device)
    positions = make_positions((t,), 32, torch.int64, device)
    _, q, k = _fused(t, d, F32, device)
    _opcheck(ops.rotary_embedding.default, (positions, q, k, d, cache, True, enable_pdl))
    _opcheck(
        ops.batched_rotary_embedding.default,
        (positions, q, k, d, cache, True, 12, positions * 0, enable_pdl),
    )
    qg, kg, cos, sin, tail = _general_args(device, F32, "sequence")
    flags = (False, False, False, enable_pdl)
    _opcheck(ops.rope_inplace.default, (qg.clone(), kg.clone(), cos, sin, *tail, *flags))
    _opcheck(
        ops.rope_out.default,
        (torch.empty_like(qg), qg, torch.empty_like(kg), kg, cos, sin, *tail, *flags),
    )
    _opcheck(ops.rope_functional.default, (qg, kg, cos, sin, *tail, *flags))
    x = make_input((2, 3, 8), F32, device)
    o = torch.empty_like(x)
    _opcheck(
        ops.apply_rotary.default,
        (
            x[..., :4],
            x[..., 4:],
            cos[0, :3, 0, :4],
            sin[0, :3, 0, :4],
            o[..., :4],
            o[..., 4:],
            False,
            enable_pdl,
        ),
    )

    qa, qb = q.clone(), q.clone()
    kernel.rotary_embedding(positions, qa, None, d, cache, True, enable_pdl=enable_pdl)
    kernel.rotary_embedding(positions, qb, None, d, cache, True)
    assert torch.equal(qa, qb)
    x4 = make_input((2, 3, 2, d), F32, device)
    c2, s2 = make_cos_sin(8, 6, F32, device)
    assert torch.equal(
        kernel.apply_rotary_emb(x4, c2, s2, enable_pdl=enable_pdl),
        kernel.apply_rotary_emb(x4, c2, s2),
    )
