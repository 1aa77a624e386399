"""torch.library conformance of the attention ops: opcheck, torch.compile parity, no recompiles.

`opcheck` runs on every C++ op and on the allocating custom op behind the Python API, with
optional arguments present and absent: schema (mutation annotations), fake kernel, autograd
registration and AOT dispatch with static and dynamic shapes. A compiled (fullgraph) model that
uses every entry point (dense, varlen, paged varlen, the KV-cache update, vLLM's cache writer)
must equal eager bit for bit, since both run the same opaque kernels; `fullgraph=True` turns any
graph break into an error.
"""

import pytest
import torch
import torch.nn as nn
from attention_cases import cu_seqlens, dtypes_for, paged_cache, randn

# opcheck's test_aot_dispatch_* differentiate ops whose inputs require grad; attn_func's inputs here
# do not require grad (the backward is tested in test_attention_bwd_ops.py).


def _opcheck(op, args):
    torch.library.opcheck(op, args)


@pytest.mark.kernels_ci
def test_opcheck_attn_fwd(kernel, device):
    ops = kernel.ops
    dtype = dtypes_for(device)[-1]
    b, s, h, hk, d = 2, 9, 4, 2, 32
    q, k, v = (
        randn((b, s, h, d), dtype, device, 1),
        randn((b, s + 3, hk, d), dtype, device, 2),
        randn((b, s + 3, hk, d), dtype, device, 3),
    )
    lse = torch.empty((b, h, s), device=device)
    slopes = torch.rand(h, device=device)
    _opcheck(
        ops.attn_fwd.default,
        (
            torch.empty_like(q),
            q,
            k,
            v,
            lse,
            None,
            None,
            None,
            None,
            None,
            None,
            slopes,
            0,
            0,
            0.2,
            0.0,
            True,
            -1,
            -1,
            0,
        ),
    )
    _opcheck(
        ops.attn_fwd.default,
        (
            torch.empty_like(q),
            q,
            k,
            v,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            0,
            0,
            0.2,
            2.0,
            False,
            4,
            2,
            1,
        ),
    )
    lens = [4, 5]
    cu = cu_seqlens(lens, device)
    qv, kv = randn((9, h, d), dtype, device, 4), randn((9, hk, d), dtype, device, 5)
    _opcheck(
        ops.attn_fwd.default,
        (
            torch.empty_like(qv),
            qv,
            kv,
            kv,
            torch.empty((h, 9), device=device),
            cu,
            cu,
            torch.tensor([2, 5], dtype=torch.int32, device=device),
            None,
            None,
            None,
            None,
            5,
            5,
            0.2,
            0.0,
            True,
            -1,
            -1,
            0,
        ),
    )
    kc, vc, table = paged_cache([k[0], k[1]], [v[0], v[1]], 8, seed=1)
    used = torch.tensor([12, 7], dtype=torch.int32, device=device)
    _opcheck(
        ops.attn_fwd.default,
        (
            torch.empty_like(q),
            q,
            kc,
            vc,
            lse,
            None,
            None,
            used,
            table,
            None,
            None,
            None,
            0,
            0,
            0.2,
            0.0,
            True,
            -1,
            -1,
            0,
        ),
    )
    idx = torch.tensor([1, 0], dtype=torch.int32, device=device)
    pad = torch.tensor([1, 0], dtype=torch.int32, device=device)
    _opcheck(
        ops.attn_fwd.default,
        (
            torch.empty_like(q),
            q,
            k,
            v,
            lse,
            None,
            None,
            None,
            None,
            idx,
            pad,
            None,
            0,
            0,
            0.2,
            0.0,
            False,
            -1,
            -1,
            0,
        ),
    )


@pytest.mark.parametrize("head_dim", [40, 59])
def test_opcheck_head_dims_between_instances(kernel, device, head_dim):
    """Head dims without a CUDA instance (40 runs the head-dim-64 kernels, 59 zero-padded copies):
    the fakes give the caller's shapes, and out is written in place."""
    ops = kernel.ops
    dtype = dtypes_for(device)[-1]
    b, s, h, hk, d = 2, 9, 4, 2, head_dim
    q, k, v = (
        randn((b, s, h, d), dtype, device, 1),
        randn((b, s + 3, hk, d), dtype, device, 2),
        randn((b, s + 3, hk, d), dtype, device, 3),
    )
    lse = torch.empty((b, h, s), device=device)
    _opcheck(
        ops.attn_fwd.default,
        (torch.empty_like(q), q, k, v, lse, None, None, None, None, None, None, None, 0, 0, 0.2,
         0.0, True, -1, -1, 0),
    )  # fmt: skip
    _opcheck(ops.fwd.default, (q, k, v, None, None, 0.0, 0.2, True, -1, -1, 0.0, False, None))
    seqlens = torch.tensor([3, 9], dtype=torch.int32, device=device)
    _opcheck(
        ops.fwd_kvcache.default,
        (q[:, :1], k.clone(), v.clone(), k[:, :1], v[:, :1], seqlens, None, None, None, None,
         None, None, None, 0.2, True, -1, -1, 0.0, True, 0),
    )  # fmt: skip


@pytest.mark.kernels_ci
def test_opcheck_flash_attn_ops(kernel, device):
    ops = kernel.ops
    dtype = dtypes_for(device)[-1]
    b, s, h, hk, d = 2, 7, 4, 2, 32
    q, k, v = (
        randn((b, s, h, d), dtype, device, 1),
        randn((b, s, hk, d), dtype, device, 2),
        randn((b, s, hk, d), dtype, device, 3),
    )
    _opcheck(ops.fwd.default, (q, k, v, None, None, 0.0, 0.2, True, -1, -1, 0.0, False, None))
    lens = [5, 9]  # every packed row in a sequence (rows outside them are left unwritten)
    cu = cu_seqlens(lens, device)
    qv, kv = q.flatten(0, 1), k.flatten(0, 1)
    _opcheck(
        ops.varlen_fwd.default,
        (
            qv,
            kv,
            kv,
            None,
            cu,
            cu,
            None,
            None,
            None,
            None,
            9,
            9,
            0.0,
            0.2,
            False,
            True,
            -1,
            -1,
            0.0,
            False,
            None,
        ),
    )
    kc = randn((b, 16, hk, d), dtype, device, 4)
    vc = randn((b, 16, hk, d), dtype, device, 5)
    seqlens = torch.tensor([3, 9], dtype=torch.int32, device=device)
    cos = torch.rand(32, 8, device=device).to(dtype)
    _opcheck(
        ops.fwd_kvcache.default,
        (
            q[:, :2],
            kc,
            vc,
            k[:, :2],
            v[:, :2],
            seqlens,
            cos,
            cos,
            None,
            None,
            None,
            None,
            None,
            0.2,
            True,
            -1,
            -1,
            0.0,
            True,
            0,
        ),
    )
    _opcheck(
        ops.fwd_kvcache.default,
        (
            q[:, :1],
            kc,
            vc,
            None,
            None,
            seqlens,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            0.2,
            False,
            -1,
            -1,
            0.0,
            True,
            0,
        ),
    )


@pytest.mark.kernels_ci
def test_opcheck_attn_func(kernel, device):
    dtype = dtypes_for(device)[-1]
    q, k = randn((2, 6, 4, 32), dtype, device, 1), randn((2, 6, 2, 32), dtype, device, 2)
    _opcheck(
        kernel.ops.attn_func.default,
        (q, k, k, None, None, None, None, None, None, None, 0, 0, 0.2, 0.0, True, -1, -1, 0),
    )


@pytest.mark.kernels_ci
def test_opcheck_cache_writers(kernel, device):
    ops = kernel.ops
    dtype = dtypes_for(device)[-1]
    key, value = randn((5, 2, 16), dtype, device, 1), randn((5, 2, 16), dtype, device, 2)
    slots = torch.tensor([3, -1, 0, 9, 4], device=device)
    _opcheck(
        ops.reshape_and_cache_flash.default,
        (
            key,
            value,
            randn((3, 4, 2, 16), dtype, device, 3),
            randn((3, 4, 2, 16), dtype, device, 4),
            slots,
            "auto",
            None,
            None,
        ),
    )
    _opcheck(
        ops.reshape_and_cache.default,
        (
            key,
            value,
            randn((3, 2, 2, 4, 8), dtype, device, 5),
            randn((3, 2, 16, 4), dtype, device, 6),
            slots.int(),
            "auto",
            None,
            None,
        ),
    )


# ---- torch.compile ----


class Decoder(nn.Module):
    """Every entry point in one graph: flash_attn_func (GQA, causal, lse), the varlen form over
    packed sequences, vLLM's cache writer into a paged cache read back by the paged varlen form,
    and flash_attn_with_kvcache appending a step (with rotary) to a contiguous cache."""

    def __init__(self, kernel):
        super().__init__()
        self.kernel = kernel

    def forward(
        self, q, k, v, cu, table, k_pages, v_pages, slots, used, k_cache, v_cache, seqlens, cos, sin
    ):
        kn = self.kernel
        out, lse, _ = kn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        qv, kv, vv = q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)
        out_v = kn.flash_attn_varlen_func(
            qv, kv, vv, cu, cu, q.shape[1], k.shape[1], causal=True, softcap=3.0
        )
        kn.reshape_and_cache_flash(kv, vv, k_pages, v_pages, slots)
        out_p = kn.flash_attn_varlen_func(
            qv[:2],
            k_pages,
            v_pages,
            cu[:3] // cu[1],
            None,
            1,
            k.shape[1],
            seqused_k=used,
            block_table=table,
        )
        out_c = kn.flash_attn_with_kvcache(
            q[:, -1:],
            k_cache,
            v_cache,
            k[:, -1:],
            v[:, -1:],
            rotary_cos=cos,
            rotary_sin=sin,
            cache_seqlens=seqlens,
            causal=True,
        )
        return out * 2, lse + 1, out_v, out_p, out_c


def _decoder_inputs(device, dtype, b=2, s=7, h=4, hk=2, d=32, seed=0):
    q = randn((b, s, h, d), dtype, device, seed + 1)
    k = randn((b, s, hk, d), dtype, device, seed + 2)
    v = randn((b, s, hk, d), dtype, device, seed + 3)
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=device)
    bs, blocks = 4, 2 * b * ((s + 3) // 4) + 2
    table = torch.arange(b * ((s + 3) // 4), dtype=torch.int32, device=device).view(b, -1)
    k_pages = torch.zeros((blocks, bs, hk, d), dtype=dtype, device=device)
    v_pages = torch.zeros_like(k_pages)
    slots = torch.cat(
        [
            table[i].long().repeat_interleave(bs)[:s] * bs + torch.arange(s, device=device) % bs
            for i in range(b)
        ]
    )
    used = torch.full((2,), s, dtype=torch.int32, device=device)
    k_cache = randn((b, s + 8, hk, d), dtype, device, seed + 4)
    v_cache = randn((b, s + 8, hk, d), dtype, device, seed + 5)
    seqlens = torch.tensor([s, 3][:b] + [1] * max(0, b - 2), dtype=torch.int32, device=device)
    cos = torch.rand(s + 16, 8, device=device).to(dtype)
    sin = torch.rand(s + 16, 8, device=device).to(dtype)
    return [q, k, v, cu, table, k_pages, v_pages, slots, used, k_cache, v_cache, seqlens, cos, sin]


@pytest.mark.slow
@pytest.mark.parametrize("head_dim", [32, 59])
def test_compile_parity(kernel, device, head_dim):
    """head_dim 59: on CUDA every op runs on zero-padded copies inside the C++ op, which the fakes
    do not see (they give the caller's shapes)."""
    if head_dim % 8 and device != "cuda":
        pytest.skip("the CPU takes any head dim without padding")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    dtype = dtypes_for(device)[-1]
    model = Decoder(kernel)
    eager_in = _decoder_inputs(device, dtype, d=head_dim)
    compiled_in = [t.clone() for t in eager_in]
    with torch.no_grad():
        eager = model(*eager_in)
        compiled = torch.compile(model, fullgraph=True)(*compiled_in)
    assert not torch._dynamo.utils.counters["graph_break"], dict(
        torch._dynamo.utils.counters["graph_break"]
    )
    for i, (a, b) in enumerate(zip(compiled, eager)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        assert torch.equal(a, b), f"output {i} differs between compiled and eager"
    for i, (a, b) in enumerate(zip(compiled_in, eager_in)):
        assert torch.equal(a, b), (
            f"input {i} (caches are updated in place) differs between compiled and eager"
        )


@pytest.mark.slow
def test_compile_with_gradients(kernel, device):
    """Under torch.compile the forward compiles and runs with requires_grad inputs, and the
    compiled backward gives eager's gradients bit for bit (deterministic=True: on CUDA the
    default adds dQ with atomics, whose order may vary)."""
    torch._dynamo.reset()
    dtype = dtypes_for(device)[-1]
    q = randn((1, 5, 2, 32), dtype, device, 1).requires_grad_()
    k = randn((1, 5, 2, 32), dtype, device, 2)

    def f(q, k):
        return kernel.flash_attn_func(q, k, k, causal=True, deterministic=True)

    out = torch.compile(f, fullgraph=True)(q, k)
    assert torch.equal(out.detach(), kernel.flash_attn_func(q.detach(), k, k, causal=True))
    out.float().sum().backward()
    compiled_grad, q.grad = q.grad, None
    f(q, k).float().sum().backward()
    assert torch.equal(compiled_grad, q.grad)


@pytest.mark.slow
def test_no_recompile_across_lengths(kernel, device):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    dtype = dtypes_for(device)[-1]

    def f(q, k, v):
        out, lse, _ = kernel.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        return out + 1, lse

    compiled = torch.compile(f, fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True), torch.no_grad():
        for i, (b, sq, sk) in enumerate([(2, 5, 9), (3, 9, 17), (2, 13, 13), (4, 6, 40)]):
            q = randn((b, sq, 4, 32), dtype, device, i)
            k = randn((b, sk, 2, 32), dtype, device, i + 10)
            v = randn((b, sk, 2, 32), dtype, device, i + 20)
            for t in (q, k, v):
                torch._dynamo.mark_dynamic(t, 0)
                torch._dynamo.mark_dynamic(t, 1)
            got = compiled(q, k, v)
            want = f(q, k, v)
            for a, w in zip(got, want):
                assert torch.equal(a, w)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert frames == 1, f"expected one compiled graph for all lengths, got {frames}"


@pytest.mark.kernels_ci
@pytest.mark.parametrize("enable_pdl", [None, True, False], ids=str)
def test_enable_pdl_reaches_the_ops(kernel, device, enable_pdl):
    """enable_pdl is the last argument of the forward ops (schema `bool? enable_pdl=None`), of
    attn_func and of the flash-attn functions; it changes how the CUDA kernels are launched, never
    the result (the CPU ignores it)."""
    ops = kernel.ops
    dtype = dtypes_for(device)[-1]
    b, s, h, hk, d = 2, 7, 4, 2, 32
    q, k, v = (
        randn((b, s, h, d), dtype, device, 1),
        randn((b, s, hk, d), dtype, device, 2),
        randn((b, s, hk, d), dtype, device, 3),
    )
    _opcheck(
        ops.attn_fwd.default,
        (
            torch.empty_like(q),
            q,
            k,
            v,
            torch.empty((b, h, s), device=device),
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            0,
            0,
            0.2,
            0.0,
            True,
            -1,
            -1,
            0,
            enable_pdl,
        ),
    )
    _opcheck(
        ops.fwd.default, (q, k, v, None, None, 0.0, 0.2, True, -1, -1, 0.0, False, None, enable_pdl)
    )
    cu = cu_seqlens([5, 9], device)
    qv, kv = q.flatten(0, 1), k.flatten(0, 1)
    _opcheck(
        ops.varlen_fwd.default,
        (
            qv,
            kv,
            kv,
            None,
            cu,
            cu,
            None,
            None,
            None,
            None,
            9,
            9,
            0.0,
            0.2,
            False,
            True,
            -1,
            -1,
            0.0,
            False,
            None,
            enable_pdl,
        ),
    )
    kc, vc = randn((b, 16, hk, d), dtype, device, 4), randn((b, 16, hk, d), dtype, device, 5)
    seqlens = torch.tensor([3, 9], dtype=torch.int32, device=device)
    _opcheck(
        ops.fwd_kvcache.default,
        (
            q[:, :2],
            kc,
            vc,
            k[:, :2],
            v[:, :2],
            seqlens,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            0.2,
            True,
            -1,
            -1,
            0.0,
            True,
            0,
            enable_pdl,
        ),
    )
    _opcheck(
        ops.attn_func.default,
        (
            q,
            k,
            v,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            0,
            0,
            0.2,
            0.0,
            True,
            -1,
            -1,
            0,
            enable_pdl,
        ),
    )

    expected = kernel.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(
        kernel.flash_attn_func(q, k, v, causal=True, enable_pdl=enable_pdl), expected
    )
    out = kernel.flash_attn_with_kvcache(
        q[:, :1], kc, vc, cache_seqlens=seqlens, enable_pdl=enable_pdl
    )
    assert torch.equal(out, kernel.flash_attn_with_kvcache(q[:, :1], kc, vc, cache_seqlens=seqlens))
