"""flash-attn's in-place forms under autograd: ``apply_rotary_emb(..., inplace=True)``,
``apply_rotary_emb_qkv_`` and ``apply_rotary_emb_kv_``.

flash-attn runs them inside autograd.Functions that rotate the input in place and return it
without marking it dirty, so they accept a leaf that requires grad (its own tests call them so:
``x = torch.randn(..., requires_grad=True)``, ``out = apply_rotary_emb(x, ..., inplace=True)``,
``out.backward(g)``, then read ``x.grad``) and views of one. The tests below call the built kernel
the same way and check that the gradients equal those of the out-of-place form (bit for bit: the
same transposed rotation) and a float64 autograd reference, and run gradcheck where the input
can be perturbed (a fresh copy per call).
"""

import pytest
import torch
from rope_cases import (
    BF16,
    F32,
    dtype_id,
    expand_half,
    make_cos_sin,
    make_input,
    rotate,
    sequence_rows,
    varlen_rows,
)


def flash64(x, cos, sin, interleaved=False, off=0, cu=None):
    """flash-attn's rotation in float64 on the CPU, differentiable w.r.t. x, cos and sin."""
    rot = 2 * cos.shape[-1]
    if cu is None:
        rows = sequence_rows(x.shape[0], x.shape[1], off)
    else:
        rows = varlen_rows(cu, off, x.shape[0])
    c = expand_half(cos[rows], interleaved).unsqueeze(-2)
    s = expand_half(sin[rows], interleaved).unsqueeze(-2)
    return rotate(x, c, s, rot, interleaved)


def f64(t, grad=False):
    return t.detach().double().cpu().requires_grad_(grad)


def close(actual, expected, what):
    # A rotation of fp32 values: a few fp32 roundings per element.
    torch.testing.assert_close(
        actual.detach().double().cpu(), expected.detach(), atol=2e-6, rtol=2e-6, msg=what
    )


@pytest.mark.parametrize("varlen", [False, True], ids=["padded", "varlen"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_id)
def test_apply_rotary_emb_inplace_leaf(kernel, device, dtype, interleaved, varlen):
    # flash-attn's calling convention: x is a leaf that requires grad.
    if varlen:
        cu = torch.tensor([0, 4, 4, 11], dtype=torch.int32, device=device)
        x0 = make_input((11, 3, 34), dtype, device)
        off = torch.tensor([2, 7, 0], dtype=torch.int32, device=device)
        kwargs = dict(cu_seqlens=cu, max_seqlen=7)
    else:
        cu = None
        x0 = make_input((2, 7, 3, 34), dtype, device)
        off = torch.tensor([2, 7], dtype=torch.int32, device=device)
        kwargs = {}
    cos, sin = make_cos_sin(20, 9, dtype, device, seed=1)  # rot 18 of 34
    g = make_input(x0.shape, dtype, device, seed=4)

    x = x0.clone().requires_grad_()
    out = kernel.apply_rotary_emb(
        x, cos, sin, interleaved=interleaved, inplace=True, seqlen_offsets=off, **kwargs
    )
    assert out.data_ptr() == x.data_ptr() and out.grad_fn is not None
    out.backward(g)

    xr = x0.clone().requires_grad_()
    ref = kernel.apply_rotary_emb(
        xr, cos, sin, interleaved=interleaved, seqlen_offsets=off, **kwargs
    )
    ref.backward(g)
    assert torch.equal(x.detach(), ref.detach()), "x must hold the rotation"
    assert torch.equal(x.grad, xr.grad), "the gradient of the out-of-place form"
    if dtype == F32:
        x64 = f64(x0, True)
        flash64(x64, f64(cos), f64(sin), interleaved, off, cu).backward(f64(g))
        close(x.grad, x64.grad, "grad x vs float64")


@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
def test_apply_rotary_emb_inplace_views_of_leaf(kernel, device, interleaved):
    # q and k as views of a packed leaf qkv, rotated in place one after the other; v is read
    # afterwards. qkv.grad: the transposed rotation of q's and k's gradients, v's unchanged.
    qkv0 = make_input((2, 5, 3, 2, 16), F32, device)
    cos, sin = make_cos_sin(8, 6, F32, device, seed=2)
    gs = [make_input((2, 5, 2, 16), F32, device, seed=10 + i) for i in range(3)]

    qkv = qkv0.clone().requires_grad_()
    q = kernel.apply_rotary_emb(qkv[:, :, 0], cos, sin, interleaved=interleaved, inplace=True)
    k = kernel.apply_rotary_emb(qkv[:, :, 1], cos, sin, interleaved=interleaved, inplace=True)
    loss = sum((t * g).sum() for t, g in zip((q, k, qkv[:, :, 2]), gs))
    loss.backward()

    r = qkv0.clone().requires_grad_()
    qr = kernel.apply_rotary_emb(r[:, :, 0], cos, sin, interleaved=interleaved)
    kr = kernel.apply_rotary_emb(r[:, :, 1], cos, sin, interleaved=interleaved)
    sum((t * g).sum() for t, g in zip((qr, kr, r[:, :, 2]), gs)).backward()
    assert torch.equal(qkv.detach()[:, :, 0], qr.detach())
    assert torch.equal(qkv.detach()[:, :, 1], kr.detach())
    assert torch.equal(qkv.grad, r.grad)


def test_apply_rotary_emb_inplace_non_leaf(kernel, device):
    # A non-leaf x is marked dirty: x itself records the rotation (its grad_fn changes).
    base = make_input((2, 6, 2, 16), F32, device).requires_grad_()
    cos, sin = make_cos_sin(6, 8, F32, device, seed=3)
    g = make_input(base.shape, F32, device, seed=5)
    x = base * 2
    out = kernel.apply_rotary_emb(x, cos, sin, inplace=True)
    assert out is x and "FlashInplace" in type(x.grad_fn).__name__
    x.backward(g)
    b64 = f64(base, True)
    flash64(b64 * 2, f64(cos), f64(sin)).backward(f64(g))
    close(base.grad, b64.grad, "grad through a non-leaf rotated in place")


@pytest.mark.parametrize("form", ["qkv", "qkv_gqa", "qkv_own_k_tables", "kv"])
def test_packed_inplace_leaf(kernel, device, form):
    # apply_rotary_emb_qkv_ / apply_rotary_emb_kv_ on a leaf that requires grad, as flash-attn's
    # tests call them; cos/sin also require grad (flash-attn gives them none; ours do).
    hq, hk, d = 4, 2, 20
    off = torch.tensor([1, 3], dtype=torch.int32, device=device)
    cos, sin = make_cos_sin(12, 8, F32, device, seed=6)
    cos_k, sin_k = make_cos_sin(12, 5, F32, device, seed=7)
    if form == "qkv":
        x0 = make_input((2, 5, 3, hq, d), F32, device)
    elif form == "qkv_gqa":
        x0 = make_input((2, 5, hq + 2 * hk, d), F32, device)
    elif form == "qkv_own_k_tables":
        x0 = make_input((2, 5, 3, hq, d), F32, device)
    else:
        x0 = make_input((2, 5, 2, hq, d), F32, device)
    g = make_input(x0.shape, F32, device, seed=8)
    tables = [t.clone().requires_grad_() for t in (cos, sin, cos_k, sin_k)]

    x = x0.clone().requires_grad_()
    if form == "qkv":
        out = kernel.apply_rotary_emb_qkv_(x, tables[0], tables[1], seqlen_offsets=off)
    elif form == "qkv_gqa":
        out = kernel.apply_rotary_emb_qkv_(
            x, tables[0], tables[1], interleaved=True, seqlen_offsets=off, num_heads_q=hq
        )
    elif form == "qkv_own_k_tables":
        out = kernel.apply_rotary_emb_qkv_(x, *tables, seqlen_offsets=off)
    else:
        out = kernel.apply_rotary_emb_kv_(x, tables[0], tables[1], seqlen_offsets=off)
    assert out.data_ptr() == x.data_ptr()
    out.backward(g)

    # float64 reference: the same rotation of the same slices, out of place.
    x64 = f64(x0, True)
    t64 = [f64(t, True) for t in (cos, sin, cos_k, sin_k)]
    if form == "qkv":
        parts = [flash64(x64[:, :, i], t64[0], t64[1], False, off) for i in (0, 1)]
        ref = torch.stack([*parts, x64[:, :, 2]], dim=2)
    elif form == "qkv_gqa":
        q = flash64(x64[:, :, :hq], t64[0], t64[1], True, off)
        k = flash64(x64[:, :, hq : hq + hk], t64[0], t64[1], True, off)
        ref = torch.cat([q, k, x64[:, :, hq + hk :]], dim=2)
    elif form == "qkv_own_k_tables":
        q = flash64(x64[:, :, 0], t64[0], t64[1], False, off)
        k = flash64(x64[:, :, 1], t64[2], t64[3], False, off)
        ref = torch.stack([q, k, x64[:, :, 2]], dim=2)
    else:
        ref = torch.stack([flash64(x64[:, :, 0], t64[0], t64[1], False, off), x64[:, :, 1]], 2)
    ref.backward(f64(g))
    close(x.detach(), ref, f"{form}: values")
    close(x.grad, x64.grad, f"{form}: grad")
    used = 4 if form == "qkv_own_k_tables" else 2
    for i, (t, t_ref) in enumerate(zip(tables, t64)):
        if i < used:
            torch.testing.assert_close(
                t.grad.double().cpu(), t_ref.grad, atol=1e-5, rtol=1e-5, msg=f"{form}: table {i}"
            )
        else:
            assert t.grad is None


@pytest.mark.filterwarnings("ignore:Input #")
def test_inplace_gradcheck(kernel, device):
    # gradcheck perturbs its inputs, so each call rotates a fresh copy (the non-leaf path; the
    # leaf path runs the same autograd.Function). fp32 with central differences of a bilinear
    # function: exact up to fp32 rounding.
    cos, sin = make_cos_sin(6, 3, F32, device, seed=9)
    cos, sin = cos.requires_grad_(), sin.requires_grad_()
    opts = dict(eps=1e-2, atol=1e-3, rtol=1e-3, fast_mode=False)
    x = make_input((1, 4, 2, 8), F32, device).requires_grad_()
    off = torch.tensor([2], dtype=torch.int32, device=device)
    assert torch.autograd.gradcheck(
        lambda x, c, s: kernel.apply_rotary_emb(
            x.clone(), c, s, interleaved=True, inplace=True, seqlen_offsets=off
        ),
        (x, cos, sin),
        **opts,
    )
    qkv = make_input((1, 4, 3, 1, 8), F32, device, seed=1).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t, c, s: kernel.apply_rotary_emb_qkv_(t.clone(), c, s, seqlen_offsets=1),
        (qkv, cos, sin),
        **opts,
    )
    kv = make_input((1, 4, 2, 2, 8), F32, device, seed=2).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t, c, s: kernel.apply_rotary_emb_kv_(t.clone(), c, s),
        (kv, cos, sin),
        **opts,
    )
