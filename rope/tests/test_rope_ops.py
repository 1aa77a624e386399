"""Values, layouts, calling conventions and backward of the rope ops.

Every value check compares the built kernel (`kernel` fixture) with the float64 references of
rope_cases.py under its tolerance model (one rounding of an fp32 result: the bound, and bit for
bit on the elements that rounding decides). Written outputs are pre-filled with NaN, so an
element the kernel does not write fails; pass-through channels must keep their bits, and every
element outside the rotated views (v of a fused qkv buffer, padding) must be left untouched.
"""

import pytest
import torch
from rope_cases import (
    BF16,
    DTYPES,
    F16,
    F32,
    HEAD_CASES,
    assert_within,
    check,
    check_grads,
    check_pass_through,
    dtype_id,
    expand_half,
    head_id,
    ltx_formula,
    make_cos_sin,
    make_cos_sin_cache,
    make_input,
    make_positions,
    nan_like,
    ref_flash,
    ref_ltx,
    ref_rotate,
    ref_transformers,
    ref_vllm,
    rotate,
    sequence_rows,
    table_dtype,
    transformers_formula,
    varlen_rows,
)
from rope_fixture import PassThrough, assert_autograd_routes_agree

HQ, HK = 4, 2  # GQA 32 / 8 scaled down
MAX_POS = 64
TABLE_KINDS = ["fp32", "same"]


def fused_qkv(tokens, head_size, dtype, device, hq=HQ, hk=HK, pad=3, seed=0):
    """A fused qkv projection output [tokens, (hq + 2 hk) * head_size + pad] and its q and k
    column views (row stride = the buffer width: not contiguous, as vLLM passes them)."""
    q_size, kv_size = hq * head_size, hk * head_size
    buf = make_input((tokens, q_size + 2 * kv_size + pad), dtype, device, seed=seed)
    return buf, buf[:, :q_size], buf[:, q_size : q_size + kv_size]


def _check_vllm(q, k, q0, k0, positions, head_size, cache, is_neox, what, offsets=None):
    rot = cache.shape[-1]
    check(q, ref_vllm(positions, q0, head_size, cache, is_neox, offsets), f"{what} query")
    check_pass_through(q, q0, rot, head_size, f"{what} query")
    if k is not None:
        check(k, ref_vllm(positions, k0, head_size, cache, is_neox, offsets), f"{what} key")
        check_pass_through(k, k0, rot, head_size, f"{what} key")


# ---- vLLM rotary_embedding ----


@pytest.mark.parametrize("head", HEAD_CASES, ids=head_id)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("tkind", TABLE_KINDS, ids=lambda k: f"table={k}")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_rotary_embedding(kernel, device, dtype, tkind, is_neox, head):
    # In place on the q and k column views of a fused qkv buffer (GQA: 4 query heads, 2 kv
    # heads); v and the padding columns must keep their bits.
    head_size, rot = head
    tokens = 13
    buf, q, k = fused_qkv(tokens, head_size, dtype, device)
    buf0 = buf.clone()
    q0, k0 = q.clone(), k.clone()
    positions = make_positions((tokens,), MAX_POS, torch.int64, device, seed=1)
    cache = make_cos_sin_cache(MAX_POS, rot, table_dtype(tkind, dtype), device)
    kernel.rotary_embedding(positions, q, k, head_size, cache, is_neox)
    what = (
        f"rotary_embedding {dtype_id(dtype)} table={tkind} neox={is_neox} D={head_size} rot={rot}"
    )
    _check_vllm(q, k, q0, k0, positions, head_size, cache, is_neox, what)
    qk = (HQ + HK) * head_size
    assert torch.equal(buf[:, qk:], buf0[:, qk:]), f"{what}: v or padding changed"


@pytest.mark.parametrize("tokens", [0, 1, 7, 300])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_rotary_embedding_tokens(kernel, device, dtype, tokens):
    head_size = 128
    q = make_input((tokens, HQ * head_size), dtype, device)
    k = make_input((tokens, HK * head_size), dtype, device, seed=2)
    q0, k0 = q.clone(), k.clone()
    positions = make_positions((tokens,), 4096, torch.int64, device, seed=1)
    cache = make_cos_sin_cache(4096, head_size, F32, device)
    kernel.rotary_embedding(positions, q, k, head_size, cache, True)
    _check_vllm(q, k, q0, k0, positions, head_size, cache, True, f"{tokens} tokens")


def _vllm_layout(layout, head_size, dtype, device, seed=0):
    """(q, k, positions-shape): the input layouts vLLM's rotary_embedding accepts."""
    b, s = 3, 5
    t = b * s
    shapes = {
        "T,HD": ((t, HQ * head_size), (t, HK * head_size), (t,)),
        "T,H,D": ((t, HQ, head_size), (t, HK, head_size), (t,)),
        "B,S,HD": ((b, s, HQ * head_size), (b, s, HK * head_size), (b, s)),
        "B,S,H,D": ((b, s, HQ, head_size), (b, s, HK, head_size), (b, s)),
    }
    if layout == "T,H,D strided":
        buf, q, k = fused_qkv(t, head_size, dtype, device, pad=0, seed=seed)
        view = buf.view(t, HQ + 2 * HK, head_size)  # head views of the fused buffer
        return view[:, :HQ], view[:, HQ : HQ + HK], (t,)
    qs, ks, ps = shapes[layout]
    return (
        make_input(qs, dtype, device, seed=seed),
        make_input(ks, dtype, device, seed=seed + 1),
        ps,
    )


@pytest.mark.parametrize("with_key", [True, False], ids=["qk", "q_only"])
@pytest.mark.parametrize("pdtype", [torch.int64, torch.int32], ids=dtype_id)
@pytest.mark.parametrize("layout", ["T,HD", "T,H,D", "B,S,HD", "B,S,H,D", "T,H,D strided"])
def test_rotary_embedding_layouts(kernel, device, layout, pdtype, with_key):
    head_size, rot = 34, 18
    q, k, pshape = _vllm_layout(layout, head_size, BF16, device)
    k = k if with_key else None
    q0 = q.clone()
    k0 = None if k is None else k.clone()
    positions = make_positions(pshape, MAX_POS, pdtype, device, seed=3)
    cache = make_cos_sin_cache(MAX_POS, rot, F32, device)
    kernel.rotary_embedding(positions, q, k, head_size, cache, False)
    _check_vllm(q, k, q0, k0, positions, head_size, cache, False, f"layout {layout}")


@pytest.mark.kernels_ci
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_id)
def test_batched_rotary_embedding(kernel, device, dtype, is_neox):
    # Multi-LoRA form: the cache holds several scaled tables one after the other; token t reads
    # row positions[t] + cos_sin_cache_offsets[t].
    head_size, rot, tokens = 80, 32, 11
    buf, q, k = fused_qkv(tokens, head_size, dtype, device)
    q0, k0 = q.clone(), k.clone()
    positions = make_positions((tokens,), MAX_POS, torch.int64, device, seed=1)
    offsets = make_positions((tokens,), 3, torch.int64, device, seed=2) * MAX_POS
    cache = make_cos_sin_cache(3 * MAX_POS, rot, F32, device)
    kernel.batched_rotary_embedding(positions, q, k, head_size, cache, is_neox, rot, offsets)
    _check_vllm(q, k, q0, k0, positions, head_size, cache, is_neox, "batched", offsets=offsets)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_apply_rope_with_cos_sin_cache_inplace(kernel, device, dtype, is_neox):
    # sgl-kernel / flashinfer name: the same rotation as vLLM's rotary_embedding (bit for bit).
    head_size, tokens = 64, 9
    buf, q, k = fused_qkv(tokens, head_size, dtype, device)
    q0, k0 = q.clone(), k.clone()
    positions = make_positions((tokens,), MAX_POS, torch.int64, device, seed=1)
    cache = make_cos_sin_cache(MAX_POS, head_size, F32, device)
    kernel.apply_rope_with_cos_sin_cache_inplace(positions, q, k, head_size, cache, is_neox=is_neox)
    _check_vllm(q, k, q0, k0, positions, head_size, cache, is_neox, "sgl")
    q2, k2 = q0.clone(), k0.clone()
    kernel.rotary_embedding(positions, q2, k2, head_size, cache, is_neox)
    assert torch.equal(q, q2) and torch.equal(k, k2)
    q3, k3 = q0.clone(), k0.clone()
    kernel.apply_rope_with_cos_sin_cache_inplace(
        positions, q3, k3, head_size, cache
    )  # is_neox defaults to True
    q2, k2 = q0.clone(), k0.clone()
    kernel.rotary_embedding(positions, q2, k2, head_size, cache, True)
    assert torch.equal(q3, q2) and torch.equal(k3, k2)


# ---- the general ops: rope_inplace / rope_out ----


def _general_case(mode, table, interleaved, dtype, tdtype, device, seed=0):
    """Inputs of one rope_inplace / rope_out call and the per-channel float64 coefficients of
    every token: (q, k, cos, sin, kwargs, rot, cos_full, sin_full).

    mode: "positions" (rows from positions [B, S]), "sequence" (s + seqlen_offset +
    seqlen_offsets[b], per-batch tables TB = B), "varlen" (packed: B = 1, cu_seqlens, per-sequence
    offsets). table: "half" (W = rot / 2), "full" (W = rot, one coefficient per channel),
    "per_head" (full, one table per head: TH = H, with Hq = Hk).
    """
    d, rot = 34, 18
    hq, hk = (3, 3) if table == "per_head" else (HQ, HK)
    th = hq if table == "per_head" else 1
    w = rot // 2 if table == "half" else rot
    g = torch.Generator().manual_seed(seed + 10)
    kwargs = dict(positions=None, seqlen_offsets=None, cu_seqlens=None, seqlen_offset=0)
    if mode == "varlen":
        b, s = 1, 10
        cu = torch.tensor([0, 3, 3, 9, 10], dtype=torch.int32)
        offs = torch.tensor([4, 0, 1, 7], dtype=torch.int32)
        kwargs.update(cu_seqlens=cu.to(device), seqlen_offsets=offs.to(device), seqlen_offset=2)
        rows = (varlen_rows(cu, offs, s) + 2)[None]
        tb = 1
    elif mode == "sequence":
        b, s = 3, 5
        offs = torch.tensor([0, 6, 2], dtype=torch.int32)
        kwargs.update(seqlen_offsets=offs.to(device), seqlen_offset=3)
        rows = sequence_rows(b, s, offs) + 3
        tb = b
    else:
        b, s = 3, 5
        pos = torch.randint(0, 16, (b, s), generator=g)
        kwargs.update(positions=pos.to(device))
        rows = pos
        tb = 1
    r = int(rows.max()) + 1
    theta = torch.rand(tb, r, th, w, generator=g, dtype=torch.float64) * 6.3
    cos, sin = (
        theta.cos().to(device=device, dtype=tdtype),
        theta.sin().to(device=device, dtype=tdtype),
    )
    bidx = torch.arange(b)[:, None].expand(b, s) if tb == b else torch.zeros(b, s, dtype=torch.long)
    cf, sf = cos.double().cpu()[bidx, rows], sin.double().cpu()[bidx, rows]  # [B, S, TH, W]
    if table == "half":
        cf, sf = expand_half(cf, interleaved), expand_half(sf, interleaved)
    q = make_input((b, s, hq, d), dtype, device, seed=seed)
    k = make_input((b, s, hk, d), dtype, device, seed=seed + 1)
    return q, k, cos, sin, kwargs, rot, cf, sf


def _padded_nan(shape, dtype, device, pad=3):
    """A NaN-filled buffer [..., D + pad] and its [..., D] view at offset 1 (the padding must
    stay NaN)."""
    buf = nan_like(shape[:-1] + (shape[-1] + pad,), dtype, device)
    return buf, buf[..., 1 : 1 + shape[-1]]


@pytest.mark.parametrize("transpose", [False, True], ids=["fwd", "transpose"])
@pytest.mark.parametrize("form", ["inplace", "out"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
@pytest.mark.parametrize("table", ["half", "full", "per_head"])
@pytest.mark.parametrize("mode", ["positions", "sequence", "varlen"])
def test_general_ops(kernel, device, mode, table, interleaved, form, transpose):
    dtype = BF16
    q, k, cos, sin, kw, rot, cf, sf = _general_case(mode, table, interleaved, dtype, F32, device)
    q0, k0 = q.clone(), k.clone()
    args = (
        cos,
        sin,
        kw["positions"],
        kw["seqlen_offsets"],
        kw["cu_seqlens"],
        kw["seqlen_offset"],
        rot,
        interleaved,
        table != "half",
        transpose,
    )
    what = f"{form} {mode} {table} interleaved={interleaved} transpose={transpose}"
    if form == "inplace":
        kernel.ops.rope_inplace(q, k, *args)
        q_res, k_res = q, k
    else:
        qb, q_res = _padded_nan(q.shape, dtype, device)
        kb, k_res = _padded_nan(k.shape, dtype, device)
        kernel.ops.rope_out(q_res, q, k_res, k, *args)
        assert torch.equal(q, q0) and torch.equal(k, k0), f"{what}: inputs changed"
        for buf in (qb, kb):
            assert buf[..., 0].isnan().all() and buf[..., 1 + q.shape[-1] :].isnan().all(), (
                f"{what}: wrote outside out"
            )
    d = q.shape[-1]
    for name, got, x0 in (("q", q_res, q0), ("k", k_res, k0)):
        check(got, ref_rotate(x0, cf, sf, rot, interleaved, transpose), f"{what} {name}")
        check_pass_through(got, x0, rot, d, f"{what} {name}")


@pytest.mark.parametrize("tkind", TABLE_KINDS, ids=lambda k: f"table={k}")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_general_ops_dtypes(kernel, device, dtype, tkind):
    # Every activation dtype with a table in fp32 or in that dtype; q only (k = None).
    q, k, cos, sin, kw, rot, cf, sf = _general_case(
        "sequence", "full", False, dtype, table_dtype(tkind, dtype), device
    )
    q0 = q.clone()
    args = (
        cos,
        sin,
        None,
        kw["seqlen_offsets"],
        None,
        kw["seqlen_offset"],
        rot,
        False,
        True,
        False,
    )
    out = nan_like(q.shape, dtype, device)
    kernel.ops.rope_out(out, q, None, None, *args)
    check(out, ref_rotate(q0, cf, sf, rot, False), f"rope_out {dtype_id(dtype)} table={tkind}")
    check_pass_through(out, q0, rot, q.shape[-1], "rope_out")
    kernel.ops.rope_inplace(q, None, *args)
    assert torch.equal(q, out)


# ---- kernels-community rotary: apply_rotary(x1, x2, cos, sin, out1, out2, conj) ----


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in_place"])
@pytest.mark.parametrize("conj", [False, True], ids=["fwd", "conj"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_apply_rotary(kernel, device, dtype, conj, in_place):
    # kernels-community's transformers adapter: x1, x2 = the two halves of q [B, H, S, D] (views),
    # cos/sin [B, 1, S, D/2] broadcast over the heads; out1 = x1 cos - x2 sin, out2 = x1 sin +
    # x2 cos (conj: the inverse rotation).
    b, h, s, d = 2, 3, 5, 34
    x = make_input((b, h, s, d), dtype, device)
    x0 = x.clone()
    theta = (
        torch.rand(b, 1, s, d // 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        * 6.3
    )
    cos, sin = (
        theta.cos().to(device=device, dtype=dtype),
        theta.sin().to(device=device, dtype=dtype),
    )
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    if in_place:
        out1, out2 = x1, x2
    else:
        out = nan_like((b, h, s, d + 2), dtype, device)
        out1, out2 = out[..., : d // 2], out[..., d // 2 : d]
    kernel.apply_rotary(x1, x2, cos, sin, out1, out2, conj)
    got = torch.cat([out1, out2], dim=-1)
    ref = ref_rotate(x0, expand_half(cos, False), expand_half(sin, False), d, False, transpose=conj)
    check(got, ref, f"apply_rotary {dtype_id(dtype)} conj={conj}")
    if not in_place:
        assert out[..., d:].isnan().all(), "apply_rotary wrote outside out1/out2"
        assert torch.equal(x, x0), "apply_rotary changed its input"


@pytest.mark.parametrize("case", ["separate", "5d", "swapped", "float64"])
def test_apply_rotary_fallback(kernel, device, case):
    # Calls the kernel path cannot take run the exact ATen fallback (fp32 math, fp64 for float64,
    # rounded once): x1, x2 as separate tensors; broadcasts that do not fold into three
    # [batch, row, head] dims; outputs aliasing the inputs crosswise; float64.
    dtype = torch.float64 if case == "float64" else BF16
    half = 9
    shape = (2, 3, 4, 5, half) if case == "5d" else (2, 3, 4, half)
    cshape = (2, 1, 4, 1, half) if case == "5d" else (2, 1, 4, half)
    x1 = make_input(shape, dtype, device, seed=1)
    x2 = make_input(shape, dtype, device, seed=2)
    theta = (
        torch.rand(cshape, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 6.3
    )
    tdt = F32 if dtype == BF16 else dtype
    cos, sin = theta.cos().to(device=device, dtype=tdt), theta.sin().to(device=device, dtype=tdt)
    a0, b0 = x1.clone(), x2.clone()
    if case == "swapped":
        out1, out2 = x2, x1  # out1 aliases x2, out2 aliases x1
    else:
        out1, out2 = nan_like(shape, dtype, device), nan_like(shape, dtype, device)
    kernel.apply_rotary(x1, x2, cos, sin, out1, out2, False)
    x = torch.cat([a0, b0], dim=-1)
    ref = ref_rotate(x, expand_half(cos, False), expand_half(sin, False), 2 * half, False)
    got = torch.cat([out1, out2], dim=-1)
    if dtype == torch.float64:
        # fp64 math rounded once: the same model with u = 2**-53 and no further rounding.
        e = 2.0**-53
        assert_within(got, ref.value, e * ref.value.abs() + 3 * e * ref.mag, "apply_rotary float64")
    else:
        check(got, ref, f"apply_rotary fallback {case}")


# ---- flash-attn apply_rotary_emb ----


def _flash_inputs(dtype, device, b=2, s=7, h=3, d=34, rot=18, seqlen_ro=20, tdtype=None, seed=0):
    x = make_input((b, s, h, d), dtype, device, seed=seed)
    cos, sin = make_cos_sin(seqlen_ro, rot // 2, tdtype or dtype, device, seed=seed + 1)
    return x, cos, sin


OFFSETS = ["none", "int", "tensor"]


def _offsets(kind, b, device):
    if kind == "none":
        return 0
    if kind == "int":
        return 5
    return torch.tensor([3, 0, 9, 1][:b], dtype=torch.int32, device=device)


@pytest.mark.parametrize("offsets", OFFSETS)
@pytest.mark.parametrize("rot", [34, 18], ids=lambda r: f"rot{r}")
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_apply_rotary_emb(kernel, device, dtype, interleaved, rot, offsets):
    x, cos, sin = _flash_inputs(dtype, device, rot=rot)
    x0 = x.clone()
    off = _offsets(offsets, x.shape[0], device)
    y = kernel.apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=off)
    assert y.dtype == dtype and y.shape == x.shape and y.data_ptr() != x.data_ptr()
    assert torch.equal(x, x0), "out of place: the input must not change"
    ref = ref_flash(x0, cos, sin, interleaved, off)
    what = (
        f"apply_rotary_emb {dtype_id(dtype)} interleaved={interleaved} rot={rot} offsets={offsets}"
    )
    check(y, ref, what)
    check_pass_through(y, x0, rot, x.shape[-1], what)
    # inplace=True: the same values, written into x (pass-through channels untouched).
    xi = x0.clone()
    yi = kernel.apply_rotary_emb(
        xi, cos, sin, interleaved=interleaved, inplace=True, seqlen_offsets=off
    )
    assert yi.data_ptr() == xi.data_ptr()
    assert torch.equal(xi, y)


@pytest.mark.parametrize("tkind", TABLE_KINDS, ids=lambda k: f"table={k}")
@pytest.mark.parametrize("dtype", [F16, BF16], ids=dtype_id)
def test_apply_rotary_emb_table_dtype(kernel, device, dtype, tkind):
    # cos/sin in fp32 with half activations (the contract's mixed form) as well as in the
    # activation dtype.
    x, cos, sin = _flash_inputs(dtype, device, d=64, rot=64, tdtype=table_dtype(tkind, dtype))
    y = kernel.apply_rotary_emb(x, cos, sin)
    assert y.dtype == dtype
    check(y, ref_flash(x, cos, sin), f"apply_rotary_emb table={tkind}")


@pytest.mark.parametrize("offsets", OFFSETS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_id)
def test_apply_rotary_emb_varlen(kernel, device, dtype, interleaved, offsets):
    # Packed sequences of lengths 3, 0, 6, 1 (an empty one included): the row of token t of
    # sequence q is t - cu_seqlens[q] + offset_q.
    h, d, rot = 3, 34, 34
    cu = torch.tensor([0, 3, 3, 9, 10], dtype=torch.int32, device=device)
    total = 10
    x = make_input((total, h, d), dtype, device)
    cos, sin = make_cos_sin(20, rot // 2, dtype, device, seed=1)
    off = _offsets(offsets, 4, device)
    y = kernel.apply_rotary_emb(
        x, cos, sin, interleaved=interleaved, seqlen_offsets=off, cu_seqlens=cu, max_seqlen=6
    )
    check(y, ref_flash(x, cos, sin, interleaved, off, cu_seqlens=cu), f"varlen offsets={offsets}")
    xi = x.clone()
    kernel.apply_rotary_emb(
        xi,
        cos,
        sin,
        interleaved=interleaved,
        inplace=True,
        seqlen_offsets=off,
        cu_seqlens=cu,
        max_seqlen=6,
    )
    assert torch.equal(xi, y)


def _flash_fn(cos, sin, interleaved, off, cu=None):
    """fn(magnitude, x) for check_grads: the flash-attn rotation in float64."""
    rot = 2 * cos.shape[-1]

    def fn(magnitude, x):
        rows = (
            sequence_rows(x.shape[0], x.shape[1], off)
            if cu is None
            else varlen_rows(cu, off, x.shape[0])
        )
        c = expand_half(cos.double().cpu()[rows], interleaved).unsqueeze(-2)
        s = expand_half(sin.double().cpu()[rows], interleaved).unsqueeze(-2)
        if magnitude:
            c, s = c.abs(), s.abs()
        return (rotate(x, c, s, rot, interleaved, magnitude=magnitude),)

    return fn


@pytest.mark.parametrize("varlen", [False, True], ids=["padded", "varlen"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_apply_rotary_emb_backward(kernel, device, dtype, interleaved, varlen):
    # The backward is the transposed rotation (flash-attn: conjugate=True) of grad_out; the
    # pass-through channels pass the gradient through.
    if varlen:
        cu = torch.tensor([0, 4, 4, 11], dtype=torch.int32, device=device)
        x = make_input((11, 3, 34), dtype, device)
        off = torch.tensor([2, 7, 0], dtype=torch.int32, device=device)
    else:
        cu = None
        x = make_input((2, 7, 3, 34), dtype, device)
        off = torch.tensor([2, 7], dtype=torch.int32, device=device)
    cos, sin = make_cos_sin(20, 9, dtype, device, seed=1)  # rot 18 of 34
    xr = x.clone().requires_grad_()
    kwargs = dict(interleaved=interleaved, seqlen_offsets=off)
    if varlen:
        kwargs.update(cu_seqlens=cu, max_seqlen=7)
    y = kernel.apply_rotary_emb(xr, cos, sin, **kwargs)
    grad_out = make_input(y.shape, dtype, device, seed=4)
    (gx,) = torch.autograd.grad(y, [xr], grad_out)
    check_grads(
        {"x": gx},
        _flash_fn(cos, sin, interleaved, off, cu),
        {"x": x},
        [grad_out],
        what="apply_rotary_emb",
    )


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_id)
def test_apply_rotary_emb_qkv_and_kv(kernel, device, dtype):
    # flash-attn's in-place forms on packed qkv [B, S, 3, H, D] (or [B, S, Hq + 2 Hk, D] with
    # num_heads_q) and kv [B, S, 2, H, D]: q and k rotated, v untouched.
    if not hasattr(kernel, "apply_rotary_emb_qkv_"):
        pytest.skip("no apply_rotary_emb_qkv_ in this package")
    b, s, h, d = 2, 6, 3, 34
    cos, sin = make_cos_sin(12, 8, dtype, device, seed=1)  # rot 16 of 34
    qkv = make_input((b, s, 3, h, d), dtype, device)
    qkv0 = qkv.clone()
    out = kernel.apply_rotary_emb_qkv_(qkv, cos, sin, seqlen_offsets=2)
    assert out.data_ptr() == qkv.data_ptr()
    for i in (0, 1):
        check(qkv[:, :, i], ref_flash(qkv0[:, :, i], cos, sin, False, 2), f"qkv_ {i}")
    assert torch.equal(qkv[:, :, 2], qkv0[:, :, 2])
    # GQA packing: [B, S, Hq + 2 Hk, D]
    qkv = make_input((b, s, HQ + 2 * HK, d), dtype, device, seed=3)
    qkv0 = qkv.clone()
    kernel.apply_rotary_emb_qkv_(qkv, cos, sin, interleaved=True, num_heads_q=HQ)
    check(qkv[:, :, :HQ], ref_flash(qkv0[:, :, :HQ], cos, sin, True), "qkv_ gqa q")
    check(
        qkv[:, :, HQ : HQ + HK], ref_flash(qkv0[:, :, HQ : HQ + HK], cos, sin, True), "qkv_ gqa k"
    )
    assert torch.equal(qkv[:, :, HQ + HK :], qkv0[:, :, HQ + HK :])
    # K with its own tables (cos_k, sin_k), per-batch offsets
    qkv = make_input((b, s, 3, h, d), dtype, device, seed=6)
    qkv0 = qkv.clone()
    cos_k, sin_k = make_cos_sin(12, 4, dtype, device, seed=7)  # rot 8 for K
    off = torch.tensor([1, 4], dtype=torch.int32, device=device)
    kernel.apply_rotary_emb_qkv_(qkv, cos, sin, cos_k, sin_k, seqlen_offsets=off)
    check(qkv[:, :, 0], ref_flash(qkv0[:, :, 0], cos, sin, False, off), "qkv_ q (own tables)")
    check(qkv[:, :, 1], ref_flash(qkv0[:, :, 1], cos_k, sin_k, False, off), "qkv_ k (cos_k, sin_k)")
    assert torch.equal(qkv[:, :, 2], qkv0[:, :, 2])
    if hasattr(kernel, "apply_rotary_emb_kv_"):
        kv = make_input((b, s, 2, h, d), dtype, device, seed=5)
        kv0 = kv.clone()
        kernel.apply_rotary_emb_kv_(kv, cos, sin, seqlen_offsets=1)
        check(kv[:, :, 0], ref_flash(kv0[:, :, 0], cos, sin, False, 1), "kv_ k")
        assert torch.equal(kv[:, :, 1], kv0[:, :, 1])


# ---- transformers form: q * cos + rotate_half(q) * sin, full cos/sin [B or 1, S, D] ----


def _hf_inputs(dtype, device, b=2, s=5, d=34, unsqueeze_dim=1, table_batch=None, seed=0):
    """q, k in transformers' layout ([B, H, S, D] for unsqueeze_dim=1, [B, S, H, D] for 2) and
    per-channel cos/sin [table_batch, S, D] (random angles, in the activation dtype as
    LlamaRotaryEmbedding returns them; not duplicated halves, so every channel has its own)."""
    if unsqueeze_dim == 1:
        qs, ks = (b, HQ, s, d), (b, HK, s, d)
    else:
        qs, ks = (b, s, HQ, d), (b, s, HK, d)
    q = make_input(qs, dtype, device, seed=seed)
    k = make_input(ks, dtype, device, seed=seed + 1)
    tb = b if table_batch is None else table_batch
    theta = (
        torch.rand(tb, s, d, generator=torch.Generator().manual_seed(seed + 2), dtype=torch.float64)
        * 6.3
    )
    return (
        q,
        k,
        theta.cos().to(device=device, dtype=dtype),
        theta.sin().to(device=device, dtype=dtype),
    )


@pytest.mark.parametrize("table_batch", [None, 1], ids=["cosB", "cos1"])
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("d", [64, 34, 6])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_apply_rotary_transformers(kernel, device, dtype, d, unsqueeze_dim, table_batch):
    q, k, cos, sin = _hf_inputs(
        dtype, device, d=d, unsqueeze_dim=unsqueeze_dim, table_batch=table_batch
    )
    q0, k0 = q.clone(), k.clone()
    qe, ke = kernel.apply_rotary_transformers(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    assert torch.equal(q, q0) and torch.equal(k, k0), "inputs must not change"
    assert qe.dtype == ke.dtype == dtype and qe.shape == q.shape and ke.shape == k.shape
    what = f"apply_rotary_transformers {dtype_id(dtype)} D={d} unsqueeze_dim={unsqueeze_dim}"
    check(qe, ref_transformers(q, cos, sin, unsqueeze_dim), what + " q")
    check(ke, ref_transformers(k, cos, sin, unsqueeze_dim), what + " k")
    q2, k2 = kernel.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    assert torch.equal(q2, qe) and torch.equal(k2, ke)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_id)
def test_apply_rotary_pos_emb_position_ids(kernel, device, dtype):
    # The pre-5.x transformers signature: position_ids is accepted and does not change the result
    # (cos/sin [B, S, D] are already the rows of each position, as transformers 5.x passes them).
    b, s, d = 2, 5, 34
    q, k, cos, sin = _hf_inputs(dtype, device, b=b, s=s, d=d)
    pid = make_positions((b, s), MAX_POS, torch.int64, device, seed=3)
    qe, ke = kernel.apply_rotary_pos_emb(q, k, cos, sin, position_ids=pid)
    q2, k2 = kernel.apply_rotary_pos_emb(q, k, cos, sin, None, 1)
    assert torch.equal(qe, q2) and torch.equal(ke, k2)
    check(qe, ref_transformers(q, cos, sin), "apply_rotary_pos_emb q")


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", [F16, BF16], ids=dtype_id)
def test_apply_rotary_transformers_promotion(kernel, device, dtype):
    # fp32 cos/sin with half q/k: eager transformers returns promote_types(q, cos) = float32 (its
    # products promote); so do we, with one rounding to float32. Partial rotary (cos narrower
    # than the head): the last channels pass through, converted to float32 exactly.
    q, k, cos, sin = _hf_inputs(F32, device, d=34)
    q, k = q.to(dtype), k.to(dtype)
    cos, sin = cos[..., :18], sin[..., :18]
    qe, ke = kernel.apply_rotary_transformers(q, k, cos, sin)
    assert qe.dtype == ke.dtype == F32
    for got, x in ((qe, q), (ke, k)):
        ref = ref_rotate(x.transpose(1, 2), cos[:, :, None], sin[:, :, None], 18, False)
        check(got.transpose(1, 2), ref, f"promotion {dtype_id(dtype)}")


def _hf_fn(unsqueeze_dim):
    def fn(magnitude, q, k, cos, sin):
        return (
            transformers_formula(q, cos, sin, unsqueeze_dim, magnitude=magnitude),
            transformers_formula(k, cos, sin, unsqueeze_dim, magnitude=magnitude),
        )

    return fn


@pytest.mark.parametrize("table_batch", [None, 1], ids=["cosB", "cos1"])
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_apply_rotary_transformers_backward(kernel, device, dtype, unsqueeze_dim, table_batch):
    # Gradients of q, k and of cos and sin (which sum over the heads of q and k, and over the
    # batch when the table is shared: N = (Hq + Hk) * B / table_batch products per element).
    b = 3
    q, k, cos, sin = _hf_inputs(
        dtype, device, b=b, d=34, unsqueeze_dim=unsqueeze_dim, table_batch=table_batch
    )
    leaves = {n: t.clone().requires_grad_() for n, t in dict(q=q, k=k, cos=cos, sin=sin).items()}
    qe, ke = kernel.apply_rotary_transformers(
        leaves["q"], leaves["k"], leaves["cos"], leaves["sin"], unsqueeze_dim=unsqueeze_dim
    )
    gq = make_input(qe.shape, dtype, device, seed=7)
    gk = make_input(ke.shape, dtype, device, seed=8)
    grads = torch.autograd.grad([qe, ke], list(leaves.values()), [gq, gk])
    n_table = (HQ + HK) * (b // cos.shape[0])
    check_grads(
        dict(zip(leaves, grads)),
        _hf_fn(unsqueeze_dim),
        dict(q=q, k=k, cos=cos, sin=sin),
        [gq, gk],
        terms={"cos": n_table, "sin": n_table},
        what=f"transformers {dtype_id(dtype)}",
    )


# ---- diffusers LTX-Video: x [B, S, H * D], interleaved pairs, per-channel freqs ----


@pytest.mark.parametrize("table_batch", [2, 1], ids=["freqsB", "freqs1"])
@pytest.mark.parametrize("tkind", TABLE_KINDS, ids=lambda k: f"table={k}")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_apply_rotary_emb_ltx(kernel, device, dtype, tkind, table_batch):
    b, s, c = 2, 7, 3 * 34
    x = make_input((b, s, c), dtype, device)
    x0 = x.clone()
    theta = (
        torch.rand(
            table_batch, s, c, generator=torch.Generator().manual_seed(1), dtype=torch.float64
        )
        * 6.3
    )
    tdtype = table_dtype(tkind, dtype)
    cos, sin = (
        theta.cos().to(device=device, dtype=tdtype),
        theta.sin().to(device=device, dtype=tdtype),
    )
    y = kernel.apply_rotary_emb_ltx(x, (cos, sin))
    assert torch.equal(x, x0)
    assert y.dtype == dtype and y.shape == x.shape
    check(y, ref_ltx(x, cos, sin), f"ltx {dtype_id(dtype)} table={tkind}")


def test_eager_autograd_route_matches_the_custom_op(kernel, device):
    """Eager calls that autograd records skip the custom op's autograd layer (its host time:
    _eager_path) and give the op's results, the tables' gradients included."""
    q, k, cos, sin = _hf_inputs(torch.bfloat16, device)
    leaves = [t.clone().requires_grad_() for t in (q, k, cos, sin)]
    assert_autograd_routes_agree(
        lambda: kernel.apply_rotary_transformers(*leaves), leaves, "RopeEager"
    )


def test_double_backward_through_the_eager_route(kernel, device):
    """With create_graph the eager route's formula calls the op, not its body, so that the
    gradient of a gradient is recorded: for the rotation R, d<R^T v, w>/dv = R w, the same bits
    as the op's route."""
    q, k, cos, sin = _hf_inputs(torch.float32, device)
    q.requires_grad_()
    v, w = (
        make_input(q.shape, torch.float32, device, seed=9),
        make_input(q.shape, torch.float32, device, seed=10),
    )

    def second_order():
        v_ = v.clone().requires_grad_()
        qe, _ = kernel.apply_rotary_transformers(q, k, cos, sin)
        (g,) = torch.autograd.grad(qe, q, v_, create_graph=True)
        (d,) = torch.autograd.grad((g * w).sum(), v_)
        return d

    eager = second_order()
    with PassThrough():
        through_op = second_order()
    assert torch.equal(eager, through_op)
    assert eager.abs().sum() > 0


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_apply_rotary_emb_ltx_backward(kernel, device, dtype):
    b, s, c = 2, 5, 2 * 34
    x = make_input((b, s, c), dtype, device)
    theta = (
        torch.rand(1, s, c, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 6.3
    )
    cos, sin = theta.cos().to(device=device, dtype=F32), theta.sin().to(device=device, dtype=F32)
    xr = x.clone().requires_grad_()
    y = kernel.apply_rotary_emb_ltx(xr, (cos, sin))
    g = make_input(y.shape, dtype, device, seed=3)
    (gx,) = torch.autograd.grad(y, [xr], g)

    def fn(magnitude, x):
        c, s_ = (
            (cos.double().cpu().abs(), sin.double().cpu().abs())
            if magnitude
            else (cos.double().cpu(), sin.double().cpu())
        )
        return (ltx_formula(x, c, s_, magnitude=magnitude),)

    check_grads({"x": gx}, fn, {"x": x}, [g], what=f"ltx backward {dtype_id(dtype)}")


# ---- properties ----


@pytest.mark.kernels_ci
def test_deterministic_and_thread_independent(kernel, device):
    # The result of each element depends on its own inputs only: re-running, and (CPU) running
    # with one thread or many, gives the same bits.
    tokens, head_size = 1031, 128
    buf, q, k = fused_qkv(tokens, head_size, BF16, device)
    positions = make_positions((tokens,), 4096, torch.int64, device, seed=1)
    cache = make_cos_sin_cache(4096, head_size, F32, device)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, max(2, threads)) if device == "cpu" else (None, None):
            if n is not None:
                torch.set_num_threads(n)
            b = buf.clone()
            qv, kv = b[:, : HQ * head_size], b[:, HQ * head_size : (HQ + HK) * head_size]
            kernel.rotary_embedding(positions, qv, kv, head_size, cache, True)
            results.append(b)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0], results[1])


@pytest.mark.kernels_ci
def test_inverse_rotation(kernel, device):
    # The transpose (flash-attn conjugate, apply_rotary conj) undoes the forward: in fp32 the
    # round trip is within 2 * 3u * mag of the input (two fp32 evaluations, each rounded once).
    x = make_input((2, 9, 3, 64), F32, device)
    cos, sin = make_cos_sin(16, 32, F32, device, seed=1)
    y = kernel.apply_rotary_emb(x, cos, sin)
    ref = ref_flash(y, cos, sin, conjugate=True)
    x1, x2 = y[..., :32], y[..., 32:]
    out1, out2 = torch.empty_like(x1), torch.empty_like(x2)
    c, s = cos[None, :9, None], sin[None, :9, None]
    kernel.apply_rotary(x1, x2, c, s, out1, out2, True)
    back = torch.cat([out1, out2], dim=-1)
    check(back, ref, "conj of the forward")
    # Round trip, with m = max|x|: each pass errs by at most u |out| + 3u (|a| + |b|) <= (sqrt(2)
    # + 6) u m (|a| + |b| <= sqrt(2) * |(a, b)| <= 2 m), the second pass carries the first one's
    # error through (|c| + |s| <= sqrt(2)), and the fp32 table is a rotation only up to
    # |cos^2 + sin^2 - 1| <= 2u: 7.4u + 7u + 10.5u + 2u < 32u, times m.
    assert_within(
        back, x.double().cpu(), torch.tensor(32 * 2.0**-24 * float(x.abs().max())), "round trip"
    )
