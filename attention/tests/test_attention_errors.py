"""Bad input: every rejected call raises, and its message names the offending argument.

Shapes, dtypes, devices and strides are checked for every device before anything runs; the
values of the index tensors (cu_seqlens, seqused_k / cache_seqlens, block tables, batch indices,
left padding) are checked on the CPU, where reading them costs nothing, before anything is
written. On CUDA the values that place KV-cache reads and writes (a key length or an appended row
past the cache or its block_table row) are checked by the kernels: the call returns with nothing
read or written out of range and NaN for the offending sequence, and the next call on the device
(or check_kvcache_errors) raises. dropout raises NotImplementedError, and so does a backward
on CUDA at a head dim past its instances.
"""

import inspect
import os

import pytest
import torch
from attention_cases import (
    BF16,
    F16,
    F32,
    cu_seqlens,
    dtypes_for,
    expect_raises,
    randn,
    sequences_check,
)


def _qkv(device, dtype=None, b=2, s=8, h=4, hk=2, d=32):
    dtype = dtype or dtypes_for(device)[-1]
    return (
        randn((b, s, h, d), dtype, device, seed=1),
        randn((b, s, hk, d), dtype, device, seed=2),
        randn((b, s, hk, d), dtype, device, seed=3),
    )


@pytest.mark.kernels_ci
def test_dense_bad_inputs(kernel, device):
    q, k, v = _qkv(device)
    f = kernel.flash_attn_func
    other = F16 if q.dtype != F16 else BF16
    calls = [
        ("k", lambda: f(q, k.to(other), v)),  # dtype mismatch
        ("v", lambda: f(q, k, v.to(other))),
        ("q", lambda: f(*(t.to(torch.int32) for t in (q, k, v)))),  # unsupported dtype
        ("q", lambda: f(q[0], k, v)),  # rank
        ("k", lambda: f(q, k[:1], v)),  # batch
        ("v", lambda: f(q, k, v[:, :4])),  # shape
        ("q", lambda: f(randn((2, 8, 3, 32), q.dtype, device), k, v)),  # 3 heads vs 2 kv heads
        ("k", lambda: f(q, randn((2, 8, 2, 16), q.dtype, device), v)),  # head_dim
        ("q", lambda: f(q[..., :0], k[..., :0], v[..., :0])),  # head_dim 0
        ("q", lambda: f(randn((2, 8, 4, 64), q.dtype, device)[..., ::2], k, v)),  # last-dim stride
        ("k", lambda: f(q, randn((2, 8, 2, 64), q.dtype, device)[..., ::2], v)),
        ("alibi_slopes", lambda: f(q, k, v, alibi_slopes=torch.ones(3, device=device))),
        ("alibi_slopes", lambda: f(q, k, v, alibi_slopes=torch.ones(4, device=device, dtype=F16))),
        ("softcap", lambda: f(q, k, v, softcap=-1.0)),
        ("window_size", lambda: f(q, k, v, window_size=3)),
    ]
    if device == "cuda":  # float64 runs on the CPU only
        calls.append(("q", lambda: f(q.double(), k.double(), v.double())))
    for arg, call in calls:
        with expect_raises(arg):
            call()


@pytest.mark.kernels_ci
def test_device_mismatch(kernel, device):
    q, k, v = _qkv(device)
    # A tensor on another device: "meta" always exists (the fake checks run for it).
    with expect_raises("k"):
        kernel.flash_attn_func(q, k.to("meta"), v)
    with expect_raises("cu_seqlens_k"):
        lens = cu_seqlens([8, 8], device)
        kernel.flash_attn_varlen_func(
            q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), lens, lens.to("meta"), 8, 8
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA head-dim and dtype rules")
def test_cuda_only_rules(kernel):
    for d in (264, 257):  # beyond the largest instance (256), a multiple of 8 or not
        q, k, v = _qkv("cuda", d=d)
        with expect_raises("q"):
            kernel.flash_attn_func(q, k, v)
        with expect_raises("q"):
            kernel.flash_attn_with_kvcache(q, k, v)
    q, k, v = _qkv("cuda", dtype=F32)
    with expect_raises("q"):
        kernel.flash_attn_func(q, k, v)  # float32 is CPU-only


@pytest.mark.kernels_ci
def test_varlen_bad_inputs(kernel, device):
    dtype = dtypes_for(device)[-1]
    lens = [3, 5]
    q = randn((8, 4, 32), dtype, device, seed=1)
    k = randn((8, 2, 32), dtype, device, seed=2)
    cu = cu_seqlens(lens, device)
    f = kernel.flash_attn_varlen_func
    calls = [
        ("cu_seqlens_q", lambda: f(q, k, k, cu.long(), cu, 5, 5)),  # not int32
        ("cu_seqlens_k", lambda: f(q, k, k, cu, cu.long(), 5, 5)),
        ("cu_seqlens_q", lambda: f(q, k, k, cu[None], cu, 5, 5)),  # not 1-D
        ("cu_seqlens_k", lambda: f(q, k, k, cu, cu[:2], 5, 5)),  # not [batch + 1]
        ("q", lambda: f(q[None], k, k, cu, cu, 5, 5)),  # rank
        (
            "seqused_k",
            lambda: f(
                q, k, k, cu, cu, 5, 5, seqused_k=torch.ones(3, dtype=torch.int32, device=device)
            ),
        ),
        ("max_seqlen_q", lambda: f(q, k, k, cu, cu, -1, 5)),
    ]
    if device == "cpu":  # values
        calls += [
            (
                "cu_seqlens_q",
                lambda: f(q, k, k, torch.tensor([0, 5, 3], dtype=torch.int32), cu, 5, 5),
            ),
            (
                "cu_seqlens_q",
                lambda: f(q, k, k, torch.tensor([0, 3, 9], dtype=torch.int32), cu, 6, 5),
            ),  # > total
            ("cu_seqlens_k", lambda: f(q, k, k, cu, cu, 5, 4)),  # a sequence longer than max
            (
                "seqused_k",
                lambda: f(q, k, k, cu, cu, 5, 5, seqused_k=torch.tensor([3, 6], dtype=torch.int32)),
            ),
        ]
    for arg, call in calls:
        with expect_raises(arg):
            call()


@pytest.mark.kernels_ci
def test_paged_bad_inputs(kernel, device):
    dtype = dtypes_for(device)[-1]
    q = randn((2, 4, 32), dtype, device, seed=1)
    cache = randn((6, 16, 2, 32), dtype, device, seed=2)
    cu = cu_seqlens([1, 1], device)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=device)
    used = torch.tensor([20, 5], dtype=torch.int32, device=device)
    f = kernel.flash_attn_varlen_func
    calls = [
        (
            "block_table",
            lambda: f(q, cache, cache, cu, None, 1, 32, seqused_k=used, block_table=table.long()),
        ),
        (
            "block_table",
            lambda: f(q, cache, cache, cu, None, 1, 32, seqused_k=used, block_table=table[:1]),
        ),
        (
            "block_table",
            lambda: f(q, cache, cache, cu, None, 1, 32, seqused_k=used, block_table=table[0]),
        ),
        ("k", lambda: f(q, cache[0], cache[0], cu, None, 1, 32, seqused_k=used, block_table=table)),
    ]
    if device == "cpu":
        bad = torch.tensor([[0, 6], [2, 3]], dtype=torch.int32)  # block 6 of 6
        neg = torch.tensor([[0, 1], [-1, 3]], dtype=torch.int32)
        calls += [
            (
                "block_table",
                lambda: f(q, cache, cache, cu, None, 1, 32, seqused_k=used, block_table=bad),
            ),
            (
                "block_table",
                lambda: f(q, cache, cache, cu, None, 1, 32, seqused_k=used, block_table=neg),
            ),
            # cache too small: 40 keys in a 2-block (32-row) table
            (
                "seqused_k",
                lambda: f(
                    q,
                    cache,
                    cache,
                    cu,
                    None,
                    1,
                    40,
                    seqused_k=torch.tensor([40, 1], dtype=torch.int32),
                    block_table=table,
                ),
            ),
            (
                "cu_seqlens_k",
                lambda: f(
                    q, cache, cache, cu, cu_seqlens([33, 1], device), 1, 33, block_table=table
                ),
            ),
        ]
    for arg, call in calls:
        with expect_raises(arg):
            call()
    # a table entry past the keys in use is never read, so it need not be valid
    ok = torch.tensor([[0, 99], [2, -5]], dtype=torch.int32, device=device)
    f(
        q,
        cache,
        cache,
        cu,
        None,
        1,
        32,
        seqused_k=torch.tensor([16, 3], dtype=torch.int32, device=device),
        block_table=ok,
    )


@pytest.mark.kernels_ci
def test_kvcache_bad_inputs(kernel, device):
    dtype = dtypes_for(device)[-1]
    b, s, h, hk, d = 2, 16, 4, 2, 32
    q = randn((b, 1, h, d), dtype, device, seed=1)
    kc = randn((b, s, hk, d), dtype, device, seed=2)
    vc = randn((b, s, hk, d), dtype, device, seed=3)
    kn = randn((b, 2, hk, d), dtype, device, seed=4)
    seqlens = torch.tensor([3, 4], dtype=torch.int32, device=device)
    cos = torch.ones(40, 8, dtype=dtype, device=device)
    f = kernel.flash_attn_with_kvcache
    calls = [
        ("cache_seqlens", lambda: f(q, kc, vc, kn, kn)),  # required with k
        ("v", lambda: f(q, kc, vc, kn, None, cache_seqlens=seqlens)),
        ("cache_seqlens", lambda: f(q, kc, vc, kn, kn, cache_seqlens=seqlens.long())),
        ("cache_seqlens", lambda: f(q, kc, vc, kn, kn, cache_seqlens=seqlens[:1])),
        ("k", lambda: f(q, kc, vc, kn[:, :, :1], kn, cache_seqlens=seqlens)),
        (
            "k_cache",
            lambda: f(randn((b, 1, 3, d), dtype, device), kc, vc, cache_seqlens=seqlens),
        ),  # heads
        (
            "rotary_cos",
            lambda: f(q, kc, vc, cache_seqlens=seqlens, rotary_cos=cos, rotary_sin=cos),
        ),  # no new k
        ("rotary_sin", lambda: f(q, kc, vc, kn, kn, cache_seqlens=seqlens, rotary_cos=cos)),
        (
            "rotary_cos",
            lambda: f(
                q,
                kc,
                vc,
                kn,
                kn,
                cache_seqlens=seqlens,
                rotary_cos=torch.ones(40, 17, dtype=dtype, device=device),
                rotary_sin=torch.ones(40, 17, dtype=dtype, device=device),
            ),
        ),  # rotary_dim > d
        (
            "cache_batch_idx",
            lambda: f(
                q,
                kc,
                vc,
                cache_seqlens=seqlens,
                cache_batch_idx=torch.zeros(b, dtype=torch.int64, device=device),
            ),
        ),
        (
            "cache_leftpad",
            lambda: f(
                q,
                kc,
                vc,
                cache_seqlens=seqlens,
                block_table=torch.zeros(b, 1, dtype=torch.int32, device=device),
                cache_leftpad=torch.zeros(b, dtype=torch.int32, device=device),
            ),
        ),
    ]
    if device == "cpu":
        calls += [
            # cache too small: 15 + 2 new rows in a 16-row cache
            (
                "cache_seqlens",
                lambda: f(
                    q, kc, vc, kn, kn, cache_seqlens=torch.tensor([15, 0], dtype=torch.int32)
                ),
            ),
            (
                "cache_batch_idx",
                lambda: f(
                    q,
                    kc,
                    vc,
                    cache_seqlens=seqlens,
                    cache_batch_idx=torch.tensor([0, 2], dtype=torch.int32),
                ),
            ),
            (
                "cache_leftpad",
                lambda: f(
                    q,
                    kc,
                    vc,
                    cache_seqlens=seqlens,
                    cache_leftpad=torch.tensor([0, 5], dtype=torch.int32),
                ),
            ),
            (
                "rotary_cos",
                lambda: f(
                    q, kc, vc, kn, kn, cache_seqlens=seqlens, rotary_cos=cos[:4], rotary_sin=cos[:4]
                ),
            ),  # table shorter than the positions
        ]
    for arg, call in calls:
        k0 = kc.clone()
        with expect_raises(arg):
            call()
        assert torch.equal(kc, k0), f"{arg}: the cache was written by a rejected call"


@pytest.mark.kernels_ci
def test_dropout_and_backward_raise(kernel, device):
    q, k, v = _qkv(device)
    with pytest.raises(NotImplementedError, match="dropout"):
        kernel.flash_attn_func(q, k, v, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="dropout"):
        kernel.ops.fwd(q, k, v, None, None, 0.1, 1.0, False, -1, -1, 0.0, False, None)
    with pytest.raises(NotImplementedError, match="return_softmax"):
        kernel.ops.fwd(q, k, v, None, None, 0.0, 1.0, False, -1, -1, 0.0, True, None)
    # forward with gradients enabled works, and so does the backward (test_attention_bwd_ops
    # checks its values)
    qg = q.clone().requires_grad_()
    out = kernel.flash_attn_func(qg, k, v, causal=True)
    assert out.requires_grad
    out.sum().backward()
    assert qg.grad is not None and qg.grad.shape == qg.shape
    with torch.no_grad():
        assert not kernel.flash_attn_func(qg, k, v).requires_grad
    with torch.inference_mode():
        kernel.flash_attn_func(q, k, v)
    # the low-level backward refuses dropout (test_attention_bwd_ops checks the rest)
    out, lse = kernel.ops.fwd(q, k, v, None, None, 0.0, 1.0, False, -1, -1, 0.0, False, None)
    low_level = (torch.ones_like(out), q, k, v, out, lse, None, None, None)
    with pytest.raises(NotImplementedError, match="dropout"):
        kernel.flash_attn_interface._flash_attn_backward(*low_level, 0.1, None, False)


def _packed(device, b=2, s=8, h=4, d=32, heads_extra=0):
    """q, k, v as [B, S, H, D] views of one packed [B, S, (3 H + heads_extra) D] buffer."""
    dtype = dtypes_for(device)[-1]
    buf = randn((b, s, (3 * h + heads_extra) * d), dtype, device, seed=4)
    q, k, v = (buf[..., i * h * d : (i + 1) * h * d].view(b, s, h, d) for i in range(3))
    return buf, q, k, v


def _fwd(kernel, q, k, v, out):
    return kernel.ops.fwd(
        q, k, v, out, None, 0.0, q.shape[-1] ** -0.5, False, -1, -1, 0.0, False, None
    )


@pytest.mark.kernels_ci
def test_strided_out_overlapping_input_is_refused(kernel, device):
    # out is a strided view of the packed qkv buffer that meets v: ATen finds them "too hard".
    b, s, h, d = 2, 8, 4, 32
    buf, q, k, v = _packed(device, b, s, h, d, heads_extra=h)
    out = buf[..., 3 * h * d - d // 2 : 4 * h * d - d // 2].view(b, s, h, d)  # half a head into v
    with expect_raises("fwd: out must not share memory with v"):
        _fwd(kernel, q, k, v, out)
    with expect_raises("fwd: out must not share memory with k"):
        _fwd(kernel, q, k, v, buf[..., h * d : 2 * h * d].view(b, s, h, d))


@pytest.mark.kernels_ci
def test_disjoint_strided_views_of_one_buffer_run(kernel, device):
    # out on the fourth quarter of a packed [q | k | v | out] buffer: interleaved address ranges, no
    # element shared. The result equals the call on separate tensors.
    b, s, h, d = 2, 8, 4, 32
    buf, q, k, v = _packed(device, b, s, h, d, heads_extra=h)
    out = buf[..., 3 * h * d :].view(b, s, h, d)
    qkv0 = buf[..., : 3 * h * d].clone()
    expected, _ = _fwd(kernel, q.clone(), k.clone(), v.clone(), None)
    got, _ = _fwd(kernel, q, k, v, out)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(buf[..., : 3 * h * d], qkv0)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


# ---- errors name the public function called, not the op it reached ----


def _public_calls(kernel, device):
    """(entry point, call) with 4 query heads and 3 kv heads (not a divisor), or alibi_slopes of
    3 heads where q, k and v come packed. The flash-attn functions reach the ops attn_fwd and
    fwd_kvcache, whose C++ checks name those ops."""
    dtype = dtypes_for(device)[-1]
    d = 32
    q = randn((2, 5, 4, d), dtype, device)
    k = randn((2, 5, 3, d), dtype, device, seed=1)
    qv, kv = q.flatten(0, 1), k.flatten(0, 1)
    cu = cu_seqlens([5, 5], device)
    qkv = randn((2, 5, 3, 4, d), dtype, device, seed=2)
    kvp = randn((2, 5, 2, 3, d), dtype, device, seed=3)
    cache = randn((2, 8, 3, d), dtype, device, seed=4)
    slopes = torch.ones(3, device=device)
    fi = kernel.flash_attn_interface
    heads = "the number of heads of q"
    alibi = "alibi_slopes must have shape"
    scale = d**-0.5
    hf = (q.transpose(1, 2), k.transpose(1, 2), k.transpose(1, 2))
    return [
        ("flash_attn_func", heads, lambda: kernel.flash_attn_func(q, k, k)),
        ("flash_attn_func", heads, lambda: fi.flash_attn_func(q, k, k)),
        (
            "flash_attn_varlen_func",
            heads,
            lambda: kernel.flash_attn_varlen_func(qv, kv, kv, cu, cu, 5, 5),
        ),
        (
            "flash_attn_qkvpacked_func",
            alibi,
            lambda: kernel.flash_attn_qkvpacked_func(qkv, alibi_slopes=slopes),
        ),
        ("flash_attn_kvpacked_func", heads, lambda: kernel.flash_attn_kvpacked_func(q, kvp)),
        (
            "flash_attn_varlen_qkvpacked_func",
            alibi,
            lambda: kernel.flash_attn_varlen_qkvpacked_func(
                qkv.flatten(0, 1), cu, 5, alibi_slopes=slopes
            ),
        ),
        (
            "flash_attn_varlen_kvpacked_func",
            heads,
            lambda: kernel.flash_attn_varlen_kvpacked_func(qv, kvp.flatten(0, 1), cu, cu, 5, 5),
        ),
        (
            "flash_attn_with_kvcache",
            heads,
            lambda: kernel.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=2),
        ),
        ("_flash_attn_forward", heads, lambda: fi._flash_attn_forward(q, k, k, 0.0, scale, False)),
        (
            "_wrapped_flash_attn_forward",
            heads,
            lambda: fi._wrapped_flash_attn_forward(q, k, k, 0.0, scale, False),
        ),
        (
            "_flash_attn_varlen_forward",
            heads,
            lambda: fi._flash_attn_varlen_forward(qv, kv, kv, cu, cu, 5, 5, 0.0, scale, False),
        ),
        (
            "_wrapped_flash_attn_varlen_forward",
            heads,
            lambda: fi._wrapped_flash_attn_varlen_forward(
                qv, kv, kv, cu, cu, 5, 5, 0.0, scale, False
            ),
        ),
        (
            "transformers_attention_forward",
            heads,
            lambda: kernel.transformers_attention_forward(None, *hf, None),
        ),
        (
            "reshape_and_cache",
            "key_cache must have shape",
            lambda: kernel.reshape_and_cache(
                kv, kv, cache, cache.clone(), torch.arange(10, device=device)
            ),
        ),
        (
            "reshape_and_cache_flash",
            "key_cache must not share memory with value_cache",
            lambda: kernel.reshape_and_cache_flash(
                kv, kv, cache, cache, torch.arange(10, device=device)
            ),
        ),
        (
            "check_kvcache_errors",
            "device must be a CUDA device index",
            lambda: kernel.check_kvcache_errors(-1),
        ),
    ]


# Public functions without parameters: no argument of theirs can be wrong, so they have no entry
# in _public_calls. The test checks that each really takes none (one that gains a parameter
# needs a bad call) and that a call with an argument is refused, naming it, before its body
# runs. use_with_diffusers' one error (a diffusers without the flash_hub registry) is tested
# below.
ARGUMENT_FREE = {"use_with_diffusers"}


@pytest.mark.kernels_ci
def test_errors_name_the_public_function_called(kernel, device):
    calls = _public_calls(kernel, device)
    public = {n for n in kernel.__all__ if callable(getattr(kernel, n))}
    assert ARGUMENT_FREE <= public, "ARGUMENT_FREE names a function that is not public"
    assert public - ARGUMENT_FREE <= {name for name, _, _ in calls}, (
        "one bad call per public function"
    )
    for name in sorted(ARGUMENT_FREE):
        fn = getattr(kernel, name)
        assert not inspect.signature(fn).parameters, f"{name} takes arguments: give it a bad call"
        with pytest.raises(TypeError, match=rf"^{name}\(\) takes 0 positional arguments"):
            fn(None)
    for name, message, call in calls:
        with pytest.raises(RuntimeError, match=rf"^{name}: {message}"):
            call()
    # the C++ entry points keep their own names
    q = randn((2, 5, 4, 32), dtypes_for(device)[-1], device)
    k = randn((2, 5, 3, 32), dtypes_for(device)[-1], device, seed=1)
    with pytest.raises(RuntimeError, match="^fwd: the number of heads of q"):
        kernel.ops.fwd(q, k, k, None, None, 0.0, 1.0, False, -1, -1, 0.0, False, None, None)


def test_use_with_diffusers_without_the_hub_registry_names_itself(kernel, monkeypatch):
    ad = pytest.importorskip("diffusers.models.attention_dispatch")
    monkeypatch.setattr(ad, "_HUB_KERNELS_REGISTRY", {})  # a diffusers without the entries
    with pytest.raises(RuntimeError, match="^use_with_diffusers: this diffusers has no flash_hub"):
        kernel.use_with_diffusers()


@pytest.mark.kernels_ci
def test_an_argument_of_the_wrong_type_names_the_function_and_its_signature(kernel, device):
    q, k, v = _qkv(device)
    with pytest.raises(TypeError, match=r"^flash_attn_func: v must be a tensor, got float"):
        kernel.flash_attn_func(q, k, 0.5)


# ---- a KV cache overflowing its rows (CPU: raised at once; CUDA: reported by the kernels) ----

_PAGE, _PAGES = 16, 2  # paged: 2 blocks of 16 rows per sequence
_ROWS = _PAGE * _PAGES  # the rows each sequence has, paged or not
_SENTINEL = 7.0


def _kvcache_case(device, dtype, paged, new, over, seed=0):
    """A decode batch of 3 whose sequence 1 ends `over` rows past its 32 rows (a [3, 32] cache, or
    a block_table row of 2 blocks x 16) once its `new` keys are appended; sequences 0 and 2 fit.
    Paged: 2 spare blocks that no table row lists hold a sentinel (a write past a table row,
    or a read of a block id past it, would reach them or worse)."""
    b, h, hk, d = 3, 4, 2, 64
    lens = [5, _ROWS - new + over, 20]
    case = dict(
        q=randn((b, 1, h, d), dtype, device, seed=seed + 1),
        k_new=randn((b, new, hk, d), dtype, device, seed=seed + 2) if new else None,
        v_new=randn((b, new, hk, d), dtype, device, seed=seed + 3) if new else None,
        lens=lens,
        table=None,
    )
    if paged:
        shape = (b * _PAGES + 2, _PAGE, hk, d)
        case["table"] = torch.tensor([[3, 0], [5, 1], [2, 4]], dtype=torch.int32, device=device)
    else:
        shape = (b, _ROWS, hk, d)
    case["k_cache"] = randn(shape, dtype, device, seed=seed + 4)
    case["v_cache"] = randn(shape, dtype, device, seed=seed + 5)
    if paged:
        case["k_cache"][b * _PAGES :] = _SENTINEL
        case["v_cache"][b * _PAGES :] = _SENTINEL
    return case


def _kvcache_call(kernel, case, lens=None):
    """The case's decode step (lens: a cache_seqlens tensor to use instead of case["lens"])."""
    if lens is None:
        lens = torch.tensor(case["lens"], dtype=torch.int32, device=case["q"].device)
    return kernel.flash_attn_with_kvcache(
        case["q"],
        case["k_cache"],
        case["v_cache"],
        case["k_new"],
        case["v_new"],
        cache_seqlens=lens,
        block_table=case["table"],
        causal=True,
        return_softmax_lse=True,
    )


def _rows_of(cache, table, b):
    """Sequence b's 32 cache rows [32, H_kv, D] (through its block_table row when paged)."""
    return cache[b] if table is None else cache[table[b].long()].flatten(0, 1)


def _expected_rows(case, before, new_rows, b, written):
    """Sequence b's rows after an append that wrote `written` of its new keys (the others were
    past its rows, or the call was refused)."""
    rows = _rows_of(before, case["table"], b).clone()
    start = case["lens"][b]
    rows[start : start + written] = new_rows[b, :written]
    return rows


def _check_kvcache_result(case, k_before, v_before, out, lse, bad):
    """The caches hold exactly the appended rows that fit (none past a sequence's rows; the spare
    blocks keep their sentinel); the fitting sequences' outputs match the reference; sequence
    `bad` (if any) has NaN out and lse."""
    new = 0 if case["k_new"] is None else case["k_new"].shape[1]
    table = case["table"]
    keys, values = [], []
    for b, start in enumerate(case["lens"]):
        written = max(0, min(new, _ROWS - start))
        for cache, before, new_rows, name in (
            (case["k_cache"], k_before, case["k_new"], "k_cache"),
            (case["v_cache"], v_before, case["v_new"], "v_cache"),
        ):
            want = _expected_rows(case, before, new_rows, b, written) if new else None
            got = _rows_of(cache, table, b)
            assert torch.equal(got, want if new else _rows_of(before, table, b)), (
                f"{name} rows of sequence {b}"
            )
        keys.append(_rows_of(case["k_cache"], table, b)[: start + new])
        values.append(_rows_of(case["v_cache"], table, b)[: start + new])
    if table is not None:
        spare = case["k_cache"][table.numel() :]
        assert bool((spare == _SENTINEL).all()), "a block outside every block_table row was written"
        assert bool((case["v_cache"][table.numel() :] == _SENTINEL).all())
    good = [b for b in range(len(case["lens"])) if b != bad]
    d = case["q"].shape[-1]
    sequences_check(
        [out[b] for b in good],
        [case["q"][b] for b in good],
        [keys[b] for b in good],
        [values[b] for b in good],
        d**-0.5,
        "fitting sequences",
        causal=True,
        lses=[lse[b] for b in good],
    )
    if bad is not None:
        assert bool(out[bad].isnan().all()), "the overflowing sequence's output must be NaN"
        assert bool(lse[bad].isnan().all()), "the overflowing sequence's lse must be NaN"


@pytest.mark.kernels_ci
@pytest.mark.parametrize("new", [0, 1, 3])
@pytest.mark.parametrize("paged", [True, False], ids=["paged", "dense"])
def test_kvcache_past_its_rows(kernel, device, paged, new):
    """cache_seqlens + new keys up to the rows a sequence has (32: its cache, or its block_table
    row) works; one row past raises an error naming block_table (paged) or cache_seqlens and
    k_cache. CPU: at once, before anything is written. CUDA: the call returns, with no read or
    write past the rows (the keys that fit are appended, the sequence's output is NaN, the other
    sequences are computed), the CUDA context stays usable, and the next call on the device
    raises (or check_kvcache_errors, which then finds nothing more)."""
    dtype = dtypes_for(device)[-1]
    cuda = device == "cuda"
    if cuda:
        kernel.check_kvcache_errors()  # no error left over by another test
    names = ["block_table"] if paged else ["cache_seqlens", "k_cache"]

    case = _kvcache_case(device, dtype, paged, new, over=0)
    k0, v0 = case["k_cache"].clone(), case["v_cache"].clone()
    out, lse = _kvcache_call(kernel, case)
    _check_kvcache_result(case, k0, v0, out, lse, bad=None)
    if cuda:
        kernel.check_kvcache_errors()

    case = _kvcache_case(device, dtype, paged, new, over=1, seed=10)
    k0, v0 = case["k_cache"].clone(), case["v_cache"].clone()
    if not cuda:
        for name in names:
            with expect_raises(name):
                _kvcache_call(kernel, case)
        assert torch.equal(case["k_cache"], k0) and torch.equal(case["v_cache"], v0)
        return
    out, lse = _kvcache_call(kernel, case)
    torch.cuda.synchronize()  # no device assertion: the context is intact
    _check_kvcache_result(case, k0, v0, out, lse, bad=1)
    fine = _kvcache_case(device, dtype, paged, new, over=0, seed=20)
    k1, v1 = fine["k_cache"].clone(), fine["v_cache"].clone()
    if new == 1:  # the next call raises, and writes nothing
        with expect_raises(names[0]) as raised:
            _kvcache_call(kernel, fine)
        assert torch.equal(fine["k_cache"], k1), "a call that raises writes nothing"
    else:
        with expect_raises(names[0]) as raised:
            kernel.check_kvcache_errors()
    message = str(raised.value)
    assert all(name in message for name in names) and "sequence 1" in message, message
    assert "earlier call" in message, message
    kernel.check_kvcache_errors()  # raised once, then cleared
    out, lse = _kvcache_call(kernel, fine)
    _check_kvcache_result(fine, k1, v1, out, lse, bad=None)
    kernel.check_kvcache_errors()


@pytest.mark.kernels_ci
def test_paged_varlen_keys_past_block_table(kernel, device):
    """flash_attn_varlen_func over a paged cache: a sequence's seqused_k up to the 32 rows of its
    block_table row works, one past raises naming block_table (CPU: at once; CUDA: the call
    returns with that sequence's output NaN and no block read past its table row, and
    check_kvcache_errors raises)."""
    dtype = dtypes_for(device)[-1]
    cuda = device == "cuda"
    if cuda:
        kernel.check_kvcache_errors()
    case = _kvcache_case(device, dtype, paged=True, new=0, over=0)
    q = case["q"].flatten(0, 1)  # [3 sequences x 1 query, H, D]
    cache, table = case["k_cache"], case["table"]
    for lens in ([5, _ROWS, 20], [5, _ROWS + 1, 20]):
        over = lens[1] > _ROWS

        def call():
            return kernel.flash_attn_varlen_func(
                q,
                cache,
                cache,
                cu_seqlens([1, 1, 1], device),
                None,
                1,
                max(lens),
                causal=True,
                seqused_k=torch.tensor(lens, dtype=torch.int32, device=device),
                block_table=table,
            )

        if over and not cuda:
            with expect_raises("block_table"):
                call()
            continue
        out = call()
        good = [0, 2] if over else [0, 1, 2]
        sequences_check(
            [out[b : b + 1] for b in good],
            [q[b : b + 1] for b in good],
            [_rows_of(cache, table, b)[: lens[b]] for b in good],
            [_rows_of(cache, table, b)[: lens[b]] for b in good],
            q.shape[-1] ** -0.5,
            f"paged varlen, lengths {lens}",
            causal=True,
        )
        if over:
            assert bool(out[1].isnan().all()), "the overflowing sequence's output must be NaN"
            torch.cuda.synchronize()
            with expect_raises("block_table"):
                kernel.check_kvcache_errors()
        elif cuda:
            kernel.check_kvcache_errors()


def test_kvcache_past_its_rows_in_a_cuda_graph(kernel, device):
    """A captured flash_attn_with_kvcache step (paged, one new key) replayed with cache_seqlens
    that fill sequence 1's block_table row: the replay appends nothing past it, sequence 1's
    output is NaN, the others are computed, and check_kvcache_errors raises naming block_table;
    the next replay with lengths that fit is correct again."""
    if device != "cuda":
        pytest.skip("CUDA graphs")
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":
        # Without the caching allocator every tensor made during capture is a cudaMalloc, which
        # a capture forbids (the memcheck runs set it so that a tensor's end is an allocation's).
        pytest.skip("graph capture needs PyTorch's caching allocator")
    kernel.check_kvcache_errors()
    case = _kvcache_case(device, BF16, paged=True, new=1, over=0)
    lens = torch.tensor(case["lens"], dtype=torch.int32, device=device)

    def step():
        return _kvcache_call(kernel, case, lens)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (torch.cuda.graphs' recipe)
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step()
    for new_lens, bad in (([5, _ROWS, 20], 1), ([6, _ROWS - 2, 21], None)):
        lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        case["lens"] = new_lens
        k0, v0 = case["k_cache"].clone(), case["v_cache"].clone()
        graph.replay()
        torch.cuda.synchronize()
        _check_kvcache_result(case, k0, v0, out, lse, bad=bad)
        if bad is None:
            kernel.check_kvcache_errors()
        else:
            with expect_raises("block_table"):
                kernel.check_kvcache_errors()
