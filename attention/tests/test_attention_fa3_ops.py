"""FlashAttention-3's API (``fa3``): its functions run the same kernels as the flash-attn 2 ones, so
their results must equal those bit for bit under FA3's parameter order and return convention;
one accuracy check per form (float64 reference) keeps the comparison from passing on a shared
defect. The private ``_flash_attn_forward`` / ``_flash_attn_backward`` (FA3's argument lists,
what diffusers' context-parallel ops call) against the public functions and autograd; FA3's
scheduling hints change nothing; what is not implemented raises, naming the argument."""

import pytest
import torch
from attention_cases import batch_check, cu_seqlens, dtypes_for, packed_check, randn


def _qkv(device, dtype, b=2, sq=37, sk=50, h=4, hk=2, d=64):
    return (
        randn((b, sq, h, d), dtype, device, seed=1),
        randn((b, sk, hk, d), dtype, device, seed=2),
        randn((b, sk, hk, d), dtype, device, seed=3),
    )


def _packed(device, dtype, lens_q, lens_k, h=4, hk=2, d=64):
    return (
        randn((sum(lens_q), h, d), dtype, device, seed=4),
        randn((sum(lens_k), hk, d), dtype, device, seed=5),
        randn((sum(lens_k), hk, d), dtype, device, seed=6),
        cu_seqlens(lens_q, device),
        cu_seqlens(lens_k, device),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_fa3_flash_attn_func_is_the_fa2_function_under_fa3_conventions(kernel, device, dtype):
    if dtype not in dtypes_for(device):
        pytest.skip("CUDA takes float16 / bfloat16")
    q, k, v = _qkv(device, dtype)
    scale = 0.11
    # FA3's order: softmax_scale, then causal, positionally
    out = kernel.fa3.flash_attn_func(q, k, v, scale, True)
    want, want_lse, _ = kernel.flash_attn_func(
        q, k, v, softmax_scale=scale, causal=True, return_attn_probs=True
    )
    assert torch.equal(out, want)
    got = kernel.fa3.flash_attn_func(q, k, v, scale, True, return_attn_probs=True)
    assert isinstance(got, tuple) and len(got) == 2  # (out, softmax_lse), FA3's convention
    assert torch.equal(got[0], want) and torch.equal(got[1], want_lse)
    # windows, softcap and the scheduling hints (ignored: the kernels choose)
    opts = dict(window_size=(9, 3), softcap=20.0)
    out, lse = kernel.fa3.flash_attn_func(
        q, k, v, num_splits=4, pack_gqa=True, sm_margin=8, return_attn_probs=True, **opts
    )
    assert torch.equal(out, kernel.flash_attn_func(q, k, v, **opts))
    batch_check(out, q, k, v, lse, "fa3 window + softcap", window=(9, 3), softcap=20.0)


def test_fa3_flash_attn_varlen_func(kernel, device):
    dtype = dtypes_for(device)[-1]
    lens_q, lens_k = [5, 40, 17], [9, 33, 60]
    q, k, v, cu_q, cu_k = _packed(device, dtype, lens_q, lens_k)
    sizes = (cu_q, cu_k, max(lens_q), max(lens_k))
    out, lse = kernel.fa3.flash_attn_varlen_func(
        q, k, v, *sizes, causal=True, return_attn_probs=True
    )
    want, want_lse, _ = kernel.flash_attn_varlen_func(
        q, k, v, *sizes, causal=True, return_attn_probs=True
    )
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    packed_check(out, q, k, v, lens_q, lens_k, "fa3 varlen", lse=lse, causal=True)
    # seqused_k keeps the first keys of each sequence
    used = torch.tensor([4, 33, 21], dtype=torch.int32, device=device)
    out = kernel.fa3.flash_attn_varlen_func(q, k, v, *sizes, seqused_k=used)
    assert torch.equal(out, kernel.flash_attn_varlen_func(q, k, v, *sizes, seqused_k=used))


def test_fa3_gradients_are_the_fa2_gradients(kernel, device):
    dtype = dtypes_for(device)[-1]
    q, k, v = _qkv(device, dtype)
    dout = randn(q.shape, dtype, device, seed=9)
    grads = []
    for fn in (kernel.fa3.flash_attn_func, kernel.flash_attn_func):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        fn(*leaves, causal=True).backward(dout)
        grads.append([t.grad for t in leaves])
    for got, want in zip(*grads):
        assert torch.equal(got, want)


def test_fa3_private_forward_and_backward(kernel, device):
    """FA3's _flash_attn_forward / _flash_attn_backward, reached as diffusers reaches them
    (flash_attn_interface of the FA3 kernel), dense and packed."""
    fa3 = kernel.fa3.flash_attn_interface
    dtype = dtypes_for(device)[-1]
    q, k, v = _qkv(device, dtype)
    scale = q.shape[-1] ** -0.5
    none3 = (None,) * 3
    dense = (None,) * 6  # cu_seqlens_q / k / k_new, seqused_q / k, then max_seqlen_q below
    out_buf = torch.full_like(q, float("nan"))
    out, lse, *rest = fa3._flash_attn_forward(
        q,
        k,
        v,
        None,
        None,
        None,
        out_buf,
        *dense[:5],
        None,
        None,
        *none3,
        *none3,
        *none3,
        scale,
        True,
    )
    assert out is out_buf and rest == [None, None]
    want, want_lse, _ = kernel.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)

    dout = randn(q.shape, dtype, device, seed=9)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    got = fa3._flash_attn_backward(
        dout, q, k, v, out, lse, None, None, None, None, None, None, dq, dk, dv, scale, True
    )
    assert got[0] is dq and got[1] is dk and got[2] is dv
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    kernel.flash_attn_func(*leaves, causal=True).backward(dout)
    for grad, leaf in zip((dq, dk, dv), leaves):
        assert torch.equal(grad, leaf.grad)
    softmax_d = (dout.float() * out.float()).sum(-1).transpose(1, 2)  # [B, H, S_q]
    torch.testing.assert_close(got[3], softmax_d, rtol=1e-5, atol=1e-5)

    lens_q, lens_k = [5, 40, 17], [9, 33, 60]
    pq, pk, pv, cu_q, cu_k = _packed(device, dtype, lens_q, lens_k)
    out, lse, _, _ = fa3._flash_attn_forward(
        pq,
        pk,
        pv,
        None,
        None,
        None,
        None,
        cu_q,
        cu_k,
        None,
        None,
        None,
        max(lens_q),
        max(lens_k),
        *none3,
        *none3,
        *none3,
        scale,
        False,
    )
    sizes = (cu_q, cu_k, max(lens_q), max(lens_k))
    want, want_lse, _ = kernel.flash_attn_varlen_func(pq, pk, pv, *sizes, return_attn_probs=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    pdout = randn(pq.shape, dtype, device, seed=10)
    dq, dk, dv, _ = fa3._flash_attn_backward(
        pdout,
        pq,
        pk,
        pv,
        out,
        lse,
        cu_q,
        cu_k,
        None,
        None,
        max(lens_q),
        max(lens_k),
        None,
        None,
        None,
        scale,
        False,
    )
    leaves = [t.clone().requires_grad_() for t in (pq, pk, pv)]
    kernel.flash_attn_varlen_func(*leaves, *sizes).backward(pdout)
    for grad, leaf in zip((dq, dk, dv), leaves):
        assert torch.equal(grad, leaf.grad)


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("qv", lambda t: {"qv": t}),
        ("q_descale", lambda t: {"q_descale": t.new_ones(1)}),
        ("v_descale", lambda t: {"v_descale": t.new_ones(1)}),
        ("attention_chunk", lambda t: {"attention_chunk": 128}),
    ],
)
def test_fa3_unsupported_arguments_raise_naming_them(kernel, device, name, kwargs):
    q, k, v = _qkv(device, dtypes_for(device)[-1])
    with pytest.raises(NotImplementedError, match=rf"^flash_attn_func: {name} is not supported"):
        kernel.fa3.flash_attn_func(q, k, v, **kwargs(q))
    lens = [5, 7]
    pq, pk, pv, cu_q, cu_k = _packed(device, q.dtype, lens, lens)
    with pytest.raises(NotImplementedError, match="^flash_attn_varlen_func: seqused_q"):
        kernel.fa3.flash_attn_varlen_func(pq, pk, pv, cu_q, cu_k, 7, 7, seqused_q=cu_q[1:])
    with pytest.raises(NotImplementedError, match="^_flash_attn_forward: page_table"):
        kernel.fa3._flash_attn_forward(q, k, v, *(None,) * 11, cu_q, *(None,) * 8, 0.125, False)
    # key lengths without packed sequences: the dense forward has none to honour
    with pytest.raises(
        NotImplementedError, match="^_flash_attn_forward without cu_seqlens_q: seqused_k"
    ):
        kernel.fa3._flash_attn_forward(q, k, v, *(None,) * 8, cu_q, *(None,) * 11, 0.125, False)


def test_fa3_qkvpacked(kernel, device):
    dtype = dtypes_for(device)[-1]
    b, s, h, hk, d = 2, 21, 4, 2, 32
    qkv = randn((b, s, 3, h, d), dtype, device, seed=11)
    out, lse = kernel.fa3.flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True)
    want, want_lse, _ = kernel.flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    # num_heads_q: the query heads, then the key heads, then the value heads (GQA)
    packed = randn((b, s, h + 2 * hk, d), dtype, device, seed=12)
    out = kernel.fa3.flash_attn_qkvpacked_func(packed, causal=True, num_heads_q=h)
    q, k, v = packed.split([h, hk, hk], dim=2)
    assert torch.equal(out, kernel.flash_attn_func(q, k, v, causal=True))
    with pytest.raises(ValueError, match=r"^flash_attn_qkvpacked_func: with num_heads_q=3"):
        kernel.fa3.flash_attn_qkvpacked_func(packed, num_heads_q=3)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_fa3_with_kvcache_is_the_fa2_function(kernel, device, paged):
    """New keys appended into the caches in place and attended to, with page_table standing for
    flash-attn 2's block_table: the same caches and outputs as the flash-attn 2 function."""
    dtype = dtypes_for(device)[-1]
    b, h, hk, d, new = 2, 4, 2, 64, 3
    q = randn((b, new, h, d), dtype, device, seed=13)
    k_new, v_new = (randn((b, new, hk, d), dtype, device, seed=i) for i in (14, 15))
    seqlens = torch.tensor([5, 17], dtype=torch.int32, device=device)
    if paged:
        block = 16
        k_cache, v_cache = (randn((4, block, hk, d), dtype, device, seed=i) for i in (16, 17))
        table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32, device=device)
    else:
        k_cache, v_cache = (randn((b, 32, hk, d), dtype, device, seed=i) for i in (16, 17))
        table = None
    caches = [(k_cache.clone(), v_cache.clone()) for _ in range(2)]
    out, lse = kernel.fa3.flash_attn_with_kvcache(
        q,
        *caches[0],
        k_new,
        v_new,
        cache_seqlens=seqlens,
        page_table=table,
        causal=True,
        return_softmax_lse=True,
    )
    want, want_lse = kernel.flash_attn_with_kvcache(
        q,
        *caches[1],
        k_new,
        v_new,
        cache_seqlens=seqlens,
        block_table=table,
        causal=True,
        return_softmax_lse=True,
    )
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    assert all(torch.equal(x, y) for x, y in zip(*caches))
    assert not torch.equal(caches[0][0], k_cache)  # the new keys were written
    with pytest.raises(NotImplementedError, match="^flash_attn_with_kvcache: cu_seqlens_q"):
        kernel.fa3.flash_attn_with_kvcache(q, k_cache, v_cache, cu_seqlens_q=seqlens)


def test_fa3_compiles_without_graph_breaks(kernel, device):
    q, k, v = _qkv(device, dtypes_for(device)[-1])

    def step(q, k, v):
        out, lse = kernel.fa3.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        return out * 2, lse

    compiled = torch.compile(step, fullgraph=True)
    got, want = compiled(q, k, v), step(q, k, v)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
