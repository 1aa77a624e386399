"""The attention forward against the float64 reference (attention_cases.py): flash-attn's dense,
packed and varlen functions, paged K/V, GQA / MQA, every mask and score option, awkward lengths
(1, prime, 1000; 4096 on CUDA), strided inputs, the lse, and O(S) memory on CUDA.

Each result must be within twice the error of PyTorch's own attention in the same dtype plus a
tiny float32 floor (attention_cases.py explains the bound).
"""

import math

import pytest
import torch
from attention_cases import (
    BF16,
    F32,
    alibi_slopes,
    batch_check,
    cu_seqlens,
    dtype_id,
    dtypes_for,
    lengths,
    nan_padded,
    packed_check,
    paged_cache,
    randn,
    sequences_check,
    untouched_past,
)
from attention_fixture import run_in_fresh_process

# (batch, len_q, len_k, heads_q, heads_kv, head_dim)
CASES = [
    (2, 17, 17, 4, 2, 64),  # GQA, a prime length
    (1, 1, 128, 8, 1, 128),  # decode, MQA
    (2, 128, 128, 4, 4, 32),
    (3, 17, 128, 4, 2, 96),  # fewer queries than keys (chunked prefill)
    (2, 128, 17, 2, 2, 64),  # more queries than keys: causal rows without any key
    (1, 1000, 1000, 2, 1, 64),
    (1, 1, 1, 2, 2, 256),
    (2, 33, 40, 6, 3, 192),
]
CPU_CASES = [(2, 19, 23, 3, 1, 16), (1, 9, 9, 2, 1, 40)]  # head dims only the CPU supports
CUDA_CASES = [(1, 4096, 4096, 8, 2, 128)] + [
    (2, 257, 300, 4, 2, d) for d in (32, 64, 96, 128, 192, 256)
]

# Score options: mask and modifiers (window = flash-attn's (left, right)).
MODES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "window": dict(window=(32, 8)),
    "causal_window": dict(causal=True, window=(16, -1)),
    "softcap": dict(softcap=2.0, causal=True),
    "alibi": dict(alibi=True, causal=True),
    "all": dict(causal=True, window=(64, 0), softcap=3.0, alibi="batch"),
}


def _case_id(c):
    return "b{}_q{}_k{}_h{}x{}_d{}".format(*c)


def _cases(device):
    return CASES + (CUDA_CASES if device == "cuda" else CPU_CASES)


def _slopes(mode, batch, heads, device):
    if not mode.get("alibi"):
        return None
    return alibi_slopes(heads, device, batch=batch if mode["alibi"] == "batch" else None)


def _per_batch(slopes, batch):
    if slopes is None:
        return None
    return [slopes if slopes.dim() == 1 else slopes[b] for b in range(batch)]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("case", CASES + CPU_CASES + CUDA_CASES, ids=_case_id)
def test_flash_attn_func(kernel, device, case, mode):
    if case not in _cases(device):
        pytest.skip(f"case for {'CUDA' if device == 'cpu' else 'the CPU'} only")
    b, sq, sk, h, hk, d = case
    opts = MODES[mode]
    window = opts.get("window", (-1, -1))
    for dtype in dtypes_for(device):
        q = randn((b, sq, h, d), dtype, device, seed=1)
        k = randn((b, sk, hk, d), dtype, device, seed=2)
        v = randn((b, sk, hk, d), dtype, device, seed=3)
        slopes = _slopes(opts, b, h, device)
        out, lse, probs = kernel.flash_attn_func(
            q,
            k,
            v,
            causal=opts.get("causal", False),
            window_size=window,
            softcap=opts.get("softcap", 0.0),
            alibi_slopes=slopes,
            return_attn_probs=True,
        )
        assert probs is None and out.dtype == dtype and out.shape == q.shape
        assert lse.dtype == F32 and lse.shape == (b, h, sq)
        sequences_check(
            [out[i] for i in range(b)],
            [q[i] for i in range(b)],
            [k[i] for i in range(b)],
            [v[i] for i in range(b)],
            d**-0.5,
            f"{dtype_id(dtype)} {mode}",
            causal=opts.get("causal", False),
            window=window,
            softcap=opts.get("softcap", 0.0),
            slopes=_per_batch(slopes, b),
            lses=[lse[i] for i in range(b)],
        )


@pytest.mark.kernels_ci
def test_returns_the_tensor_alone_by_default(kernel, device):
    q = randn((1, 5, 2, 32), BF16, device)
    out = kernel.flash_attn_func(q, q, q, causal=True)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape


def test_softmax_scale(kernel, device):
    b, s, h, d = 2, 21, 2, 64
    for dtype in dtypes_for(device):
        q, k, v = (randn((b, s, h, d), dtype, device, seed=i) for i in range(3))
        out = kernel.flash_attn_func(q, k, v, softmax_scale=0.3, causal=True)
        sequences_check(
            [out[i] for i in range(b)],
            q.unbind(0),
            k.unbind(0),
            v.unbind(0),
            0.3,
            dtype_id(dtype),
            causal=True,
        )


def test_strided_inputs(kernel, device):
    """Views with unit stride along head_dim only: q sliced out of a wider buffer, k / v the
    [B, S, H, D] transposes of [B, H, S, D] tensors (transformers' layout), out into a
    preallocated strided buffer via the low-level op."""
    b, sq, sk, h, hk, d = 2, 37, 45, 4, 2, 64
    for dtype in dtypes_for(device):
        q = randn((b, sq, h, 2 * d), dtype, device, seed=1)[..., d:]
        k = randn((b, hk, sk, d), dtype, device, seed=2).transpose(1, 2)
        v = randn((b, hk, sk, d), dtype, device, seed=3).transpose(1, 2)
        assert not q.is_contiguous() and not k.is_contiguous()
        out, lse, _ = kernel.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        sequences_check(
            list(out.unbind(0)),
            q.unbind(0),
            k.unbind(0),
            v.unbind(0),
            d**-0.5,
            dtype_id(dtype),
            causal=True,
            lses=list(lse.unbind(0)),
        )
        # views starting one element into their buffer (not 16-byte aligned: the CUDA binding
        # reads them through aligned copies) give the same result
        qm = torch.empty((b, sq, h, d + 1), dtype=dtype, device=device)[..., 1:]
        qm.copy_(q)
        km = torch.empty((b, sk, hk, d + 1), dtype=dtype, device=device)[..., 1:]
        km.copy_(k)
        assert torch.equal(kernel.flash_attn_func(qm, km, v, causal=True), out)
        # out-param op into a strided, sentinel-filled buffer: every other element stays intact
        buf = torch.full((b, sq, h, 2 * d), 7.0, dtype=dtype, device=device)
        dst = buf[..., :d]
        kernel.ops.attn_fwd(
            dst,
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
            d**-0.5,
            0.0,
            True,
            -1,
            -1,
            0,
        )
        assert torch.equal(dst, out)
        assert bool((buf[..., d:] == 7.0).all())
        buf = torch.full((b, sq, h, d + 1), 7.0, dtype=dtype, device=device)
        kernel.ops.attn_fwd(
            buf[..., 1:],
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
            d**-0.5,
            0.0,
            True,
            -1,
            -1,
            0,
        )  # an unaligned out (CUDA: written through a temporary)
        assert torch.equal(buf[..., 1:], out) and bool((buf[..., 0] == 7.0).all())


def test_packed_forms(kernel, device):
    b, s, h, hk, d = 2, 29, 4, 2, 64
    for dtype in dtypes_for(device):
        qkv = randn((b, s, 3, h, d), dtype, device, seed=1)
        out = kernel.flash_attn_qkvpacked_func(qkv, causal=True)
        q, k, v = qkv.unbind(2)
        sequences_check(
            list(out.unbind(0)),
            q.unbind(0),
            k.unbind(0),
            v.unbind(0),
            d**-0.5,
            "qkvpacked",
            causal=True,
        )

        q = randn((b, s, h, d), dtype, device, seed=2)
        kv = randn((b, s + 5, 2, hk, d), dtype, device, seed=3)
        out = kernel.flash_attn_kvpacked_func(q, kv, window_size=(8, 8))
        k, v = kv.unbind(2)
        sequences_check(
            list(out.unbind(0)),
            q.unbind(0),
            k.unbind(0),
            v.unbind(0),
            d**-0.5,
            "kvpacked",
            window=(8, 8),
        )

        lens = [5, 1, 17]
        cu = cu_seqlens(lens, device)
        qkv = randn((sum(lens), 3, h, d), dtype, device, seed=4)
        out = kernel.flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=True)
        q, k, v = qkv.unbind(1)
        split = lambda t: list(t.split(lens))  # noqa: E731
        sequences_check(
            split(out), split(q), split(k), split(v), d**-0.5, "varlen qkvpacked", causal=True
        )

        lens_k = [9, 3, 20]
        cu_k = cu_seqlens(lens_k, device)
        q = randn((sum(lens), h, d), dtype, device, seed=5)
        kv = randn((sum(lens_k), 2, hk, d), dtype, device, seed=6)
        out = kernel.flash_attn_varlen_kvpacked_func(
            q, kv, cu, cu_k, max(lens), max(lens_k), causal=True
        )
        k, v = kv.unbind(1)
        sequences_check(
            split(out),
            split(q),
            list(k.split(lens_k)),
            list(v.split(lens_k)),
            d**-0.5,
            "varlen kvpacked",
            causal=True,
        )


VARLEN_MODES = ["plain", "causal", "causal_window", "softcap", "all"]


@pytest.mark.parametrize("mode", VARLEN_MODES)
def test_varlen(kernel, device, mode):
    """Ragged batches: random lengths plus the edge ones (1, an empty query sequence, a sequence
    with no key), queries and keys of different lengths."""
    opts = MODES[mode]
    h, hk, d = 4, 2, 64
    lens_q = [1, 0, 17, 130] + lengths(1, 4, 1, 300)
    lens_k = [1, 5, 0, 200] + lengths(2, 4, 1, 300)
    batch = len(lens_q)
    cu_q, cu_k = cu_seqlens(lens_q, device), cu_seqlens(lens_k, device)
    window = opts.get("window", (-1, -1))
    for dtype in dtypes_for(device):
        q = randn((sum(lens_q), h, d), dtype, device, seed=1)
        k = randn((sum(lens_k), hk, d), dtype, device, seed=2)
        v = randn((sum(lens_k), hk, d), dtype, device, seed=3)
        slopes = _slopes(opts, batch, h, device)
        out, lse, _ = kernel.flash_attn_varlen_func(
            q,
            k,
            v,
            cu_q,
            cu_k,
            max(lens_q),
            max(lens_k),
            causal=opts.get("causal", False),
            window_size=window,
            softcap=opts.get("softcap", 0.0),
            alibi_slopes=slopes,
            return_attn_probs=True,
        )
        assert lse.shape == (h, sum(lens_q))
        packed_check(
            out,
            q,
            k,
            v,
            lens_q,
            lens_k,
            f"{dtype_id(dtype)} varlen {mode}",
            lse,
            causal=opts.get("causal", False),
            window=window,
            softcap=opts.get("softcap", 0.0),
            slopes=_per_batch(slopes, batch),
        )


def test_varlen_seqused_k(kernel, device):
    """seqused_k limits each packed sequence to its first keys (vLLM's convention)."""
    h, hk, d = 4, 1, 32
    lens_q, lens_k = [3, 7, 1], [10, 20, 5]
    used = [4, 20, 0]
    cu_q, cu_k = cu_seqlens(lens_q, device), cu_seqlens(lens_k, device)
    for dtype in dtypes_for(device):
        q = randn((sum(lens_q), h, d), dtype, device, seed=1)
        k = randn((sum(lens_k), hk, d), dtype, device, seed=2)
        v = randn((sum(lens_k), hk, d), dtype, device, seed=3)
        out = kernel.flash_attn_varlen_func(
            q,
            k,
            v,
            cu_q,
            cu_k,
            max(lens_q),
            max(lens_k),
            causal=True,
            seqused_k=torch.tensor(used, dtype=torch.int32, device=device),
        )
        ks = [t[:u] for t, u in zip(k.split(lens_k), used)]
        vs = [t[:u] for t, u in zip(v.split(lens_k), used)]
        sequences_check(
            list(out.split(lens_q)),
            list(q.split(lens_q)),
            ks,
            vs,
            d**-0.5,
            dtype_id(dtype),
            causal=True,
        )


@pytest.mark.parametrize("block_size", [16, 256, 7])
def test_varlen_paged(kernel, device, block_size):
    """Paged K/V (vLLM's layout) read through a random block table, lengths from cu_seqlens_k or
    seqused_k; a table wider than needed, and garbage in the unused cache rows."""
    h, hk, d = 8, 2, 64
    lens_q = [1, 17, 5, 40]
    lens_k = [1, 300, 33, 256]
    cu_q = cu_seqlens(lens_q, device)
    for dtype in dtypes_for(device):
        ks = [randn((n, hk, d), dtype, device, seed=10 + i) for i, n in enumerate(lens_k)]
        vs = [randn((n, hk, d), dtype, device, seed=20 + i) for i, n in enumerate(lens_k)]
        k_cache, v_cache, table = paged_cache(
            ks, vs, block_size, seed=3, max_blocks=math.ceil(max(lens_k) / block_size) + 2
        )
        q = randn((sum(lens_q), h, d), dtype, device, seed=1)
        lens = torch.tensor(lens_k, dtype=torch.int32, device=device)
        for kwargs in (
            dict(cu_seqlens_k=cu_seqlens(lens_k, device)),
            dict(cu_seqlens_k=None, seqused_k=lens),
        ):
            out = kernel.flash_attn_varlen_func(
                q,
                k_cache,
                v_cache,
                cu_seqlens_q=cu_q,
                max_seqlen_q=max(lens_q),
                max_seqlen_k=max(lens_k),
                causal=True,
                block_table=table,
                **kwargs,
            )
            sequences_check(
                list(out.split(lens_q)),
                list(q.split(lens_q)),
                ks,
                vs,
                d**-0.5,
                f"{dtype_id(dtype)} paged {block_size}",
                causal=True,
            )


def test_low_level_ops(kernel, device):
    """flash-attn's C++ entry points: fwd and varlen_fwd return [out, softmax_lse]."""
    dtype = dtypes_for(device)[-1]
    b, s, h, d = 2, 19, 2, 64
    q, k, v = (randn((b, s, h, d), dtype, device, seed=i) for i in range(3))
    out, lse = kernel.ops.fwd(q, k, v, None, None, 0.0, d**-0.5, True, -1, -1, 0.0, False, None)
    want, want_lse, _ = kernel.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    dst = torch.empty_like(q)
    out2, _ = kernel.ops.fwd(q, k, v, dst, None, 0.0, d**-0.5, True, -1, -1, 0.0, False, None)
    assert out2.data_ptr() == dst.data_ptr() and torch.equal(dst, want)

    lens = [7, 12]
    cu = cu_seqlens(lens, device)
    qv, kv, vv = (randn((sum(lens), h, d), dtype, device, seed=i) for i in range(3))
    out, lse = kernel.ops.varlen_fwd(
        qv,
        kv,
        vv,
        None,
        cu,
        cu,
        None,
        None,
        None,
        None,
        max(lens),
        max(lens),
        0.0,
        d**-0.5,
        False,
        True,
        -1,
        -1,
        0.0,
        False,
        None,
    )
    want, want_lse, _ = kernel.flash_attn_varlen_func(
        qv, kv, vv, cu, cu, max(lens), max(lens), causal=True, return_attn_probs=True
    )
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    # zero_tensors: rows outside every sequence are 0 (and their lse -inf)
    qp = torch.cat([qv, randn((3, h, d), dtype, device, seed=9)])
    out, lse = kernel.ops.varlen_fwd(
        qp,
        kv,
        vv,
        None,
        cu,
        cu,
        None,
        None,
        None,
        None,
        max(lens),
        max(lens),
        0.0,
        d**-0.5,
        True,
        True,
        -1,
        -1,
        0.0,
        False,
        None,
    )
    assert torch.equal(out[: sum(lens)], want) and bool((out[sum(lens) :] == 0).all())
    assert bool((lse[:, sum(lens) :] == float("-inf")).all())


# flash-attn 2.8.4's private forwards, parameter for parameter (flash_attn_interface.py).
FA_FORWARD_PARAMS = [
    "q",
    "k",
    "v",
    "dropout_p",
    "softmax_scale",
    "causal",
    "window_size_left",
    "window_size_right",
    "softcap",
    "alibi_slopes",
    "return_softmax",
]
FA_VARLEN_FORWARD_PARAMS = [
    "q",
    "k",
    "v",
    "cu_seqlens_q",
    "cu_seqlens_k",
    "max_seqlen_q",
    "max_seqlen_k",
    "dropout_p",
    "softmax_scale",
    "causal",
    "window_size_left",
    "window_size_right",
    "softcap",
    "alibi_slopes",
    "return_softmax",
    "block_table",
    "leftpad_k",
    "seqused_k",
    "zero_tensors",
    "num_splits",
]


def test_private_forwards_flash_attn_28_signatures(kernel, device):
    """`_flash_attn_forward` / `_flash_attn_varlen_forward` called as flash-attn 2.8.x's callers
    call them: every parameter positionally in flash-attn's order, and `num_splits=` (2.8.4's
    last parameter of the varlen forward) by keyword."""
    import inspect

    fai = kernel.flash_attn_interface
    for fn, names in (
        (fai._flash_attn_forward, FA_FORWARD_PARAMS),
        (fai._flash_attn_varlen_forward, FA_VARLEN_FORWARD_PARAMS),
    ):
        assert list(inspect.signature(fn).parameters) == names, fn.__name__
    # flash-attn's _wrapped_* names take the same arguments (ours are error-naming wrappers of
    # the same functions, so each names itself in an error).
    for alias, fn in (
        (fai._wrapped_flash_attn_forward, fai._flash_attn_forward),
        (fai._wrapped_flash_attn_varlen_forward, fai._flash_attn_varlen_forward),
    ):
        assert inspect.signature(alias) == inspect.signature(fn)

    dtype = dtypes_for(device)[-1]
    h, d = 2, 64
    lens = [7, 12]
    cu = cu_seqlens(lens, device)
    q, k, v = (randn((sum(lens), h, d), dtype, device, seed=i) for i in range(3))
    want, want_lse, _ = kernel.flash_attn_varlen_func(
        q, k, v, cu, cu, max(lens), max(lens), causal=True, return_attn_probs=True
    )
    for num_splits in (0, 1, 3):
        positional = fai._flash_attn_varlen_forward(
            q, k, v, cu, cu, max(lens), max(lens), 0.0, d**-0.5, True,
            -1, -1, 0.0, None, False, None, None, None, False, num_splits,
        )  # fmt: skip
        keyword = fai._flash_attn_varlen_forward(
            q, k, v, cu, cu, max(lens), max(lens), 0.0, d**-0.5, True, num_splits=num_splits
        )
        for out, lse, s_dmask, rng_state in (positional, keyword):
            assert s_dmask is None and rng_state is None
            if device == "cpu" or num_splits == 0:  # the CPU ignores num_splits
                assert torch.equal(out, want) and torch.equal(lse, want_lse), num_splits
            else:  # CUDA combines the splits: a schedule, not semantics
                torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)
                torch.testing.assert_close(lse, want_lse, atol=1e-4, rtol=1e-4)
    with pytest.raises(RuntimeError, match="num_splits must be >= 0"):
        fai._flash_attn_varlen_forward(
            q, k, v, cu, cu, max(lens), max(lens), 0.0, d**-0.5, True, num_splits=-1
        )

    b, s = 2, 9
    q, k, v = (randn((b, s, h, d), dtype, device, seed=3 + i) for i in range(3))
    want, want_lse, _ = kernel.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    out, lse, _, _ = fai._flash_attn_forward(q, k, v, 0.0, d**-0.5, True, -1, -1, 0.0, None, False)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


def test_num_splits_do_not_change_the_result(kernel, device):
    """num_splits (split-KV) is a schedule, not semantics: the CPU ignores it (bit-identical
    results); CUDA combines the splits, each result within the bound."""
    dtype = dtypes_for(device)[-1]
    b, sq, sk, h, hk, d = 3, 1, 777, 8, 2, 128
    q = randn((b, sq, h, d), dtype, device, seed=1)
    k = randn((b, sk, hk, d), dtype, device, seed=2)
    v = randn((b, sk, hk, d), dtype, device, seed=3)
    results = []
    for splits in (0, 1, 3, 16):
        out = torch.empty_like(q)
        lse = torch.empty((b, h, sq), dtype=F32, device=device)
        kernel.ops.attn_fwd(
            out,
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
            None,
            0,
            0,
            d**-0.5,
            0.0,
            True,
            -1,
            -1,
            splits,
        )
        sequences_check(
            list(out.unbind(0)),
            q.unbind(0),
            k.unbind(0),
            v.unbind(0),
            d**-0.5,
            f"splits {splits}",
            causal=True,
            lses=list(lse.unbind(0)),
        )
        results.append(out)
    if device == "cpu":
        assert all(torch.equal(r, results[0]) for r in results)


@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 192, 256])
def test_split_kv_merges_at_every_head_dim(kernel, device, head_dim):
    """Split-KV decode at every head dim (the decode tiles and the combine kernel of the CUDA
    build), from 2 splits to 100 (more than one per lane in the combine's weight pass, and several
    rounds of its split-row loads: 71 splits of 4500 keys at head dim <= 128, whose 64-key tiles
    cap the count). The sliding window leaves splits without a visible key; out and lse start as
    NaN, so a row left unwritten fails."""
    dtype = dtypes_for(device)[-1]
    b, sq, sk, h, hk, d = 2, 1, 4500, 8, 2, head_dim
    q = randn((b, sq, h, d), dtype, device, seed=4)
    k = randn((b, sk, hk, d), dtype, device, seed=5)
    v = randn((b, sk, hk, d), dtype, device, seed=6)
    for splits in (2, 7, 16, 17, 40, 100):
        for window in ((-1, -1), (200, 0)):
            out = torch.full_like(q, float("nan"))
            lse = torch.full((b, h, sq), float("nan"), dtype=F32, device=device)
            kernel.ops.attn_fwd(
                out,
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
                None,
                0,
                0,
                d**-0.5,
                0.0,
                False,
                window[0],
                window[1],
                splits,
            )
            sequences_check(
                list(out.unbind(0)),
                q.unbind(0),
                k.unbind(0),
                v.unbind(0),
                d**-0.5,
                f"d {d} splits {splits} window {window}",
                window=window,
                lses=list(lse.unbind(0)),
            )


# Head dims without an instance of their own (flash-attn takes every head dim up to 256): CUDA runs
# a multiple of 8 on the next instantiated head dim with the columns past it zero-filled (40 on 64,
# 80 on 96, 160 on 192, 224 on 256), and any other (59, 111) on zero-padded copies.
BETWEEN_HEAD_DIMS = [40, 59, 80, 111, 160, 224]


@pytest.mark.parametrize("head_dim", BETWEEN_HEAD_DIMS)
def test_head_dims_between_instances(kernel, device, head_dim):
    """Dense prefill (GQA; causal with whole query tiles above the diagonal; a window with softcap
    and ALiBi, the score-modifier build), decode (the decode tiles; split-KV merged by the combine
    kernel or, on sm_90+, in a cluster), varlen and paged K/V at head dims between the CUDA
    instances. Outputs are views of NaN-filled buffers with wider rows: a column of out written
    past head_dim, or left unwritten, fails. softmax_scale defaults to head_dim ** -0.5 of the
    caller's head dim. The CPU takes any head dim; one dtype there."""
    d = head_dim
    for dtype in dtypes_for(device) if device == "cuda" else [BF16]:
        what = f"{dtype_id(dtype)} d {d}"
        # dense, causal, default scale: rows 0..139 see no key (whole empty query tiles)
        b, sq, sk, h, hk = 2, 200, 60, 4, 2
        q = randn((b, sq, h, d), dtype, device, seed=1)
        k = randn((b, sk, hk, d), dtype, device, seed=2)
        v = randn((b, sk, hk, d), dtype, device, seed=3)
        out, lse, _ = kernel.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        assert out.shape == q.shape and lse.shape == (b, h, sq)
        batch_check(out, q, k, v, lse, f"{what} causal", causal=True)
        # dense, window + softcap + ALiBi, into out=
        b, sq, sk, h, hk = 2, 70, 90, 4, 1
        q = randn((b, sq, h, d), dtype, device, seed=4)
        k = randn((b, sk, hk, d), dtype, device, seed=5)
        v = randn((b, sk, hk, d), dtype, device, seed=6)
        slopes = alibi_slopes(h, device, batch=b)
        buf, dst = nan_padded(q.shape, dtype, device)
        got, lse = kernel.ops.fwd(
            q, k, v, dst, slopes, 0.0, d**-0.5, False, 24, 8, 3.0, False, None
        )
        assert got.data_ptr() == dst.data_ptr()
        untouched_past(buf, d, f"{what} fwd out=")
        batch_check(
            dst, q, k, v, lse, f"{what} window softcap alibi", window=(24, 8), softcap=3.0,
            slopes=list(slopes.unbind(0)),
        )  # fmt: skip
        # decode, split-KV: 0 (the kernel's choice), 3 (on sm_90+ a cluster), 16 (the combine
        # kernel); the window leaves splits without a visible key
        b, sk, h, hk = 2, 1500, 8, 2
        q = randn((b, 1, h, d), dtype, device, seed=7)
        k = randn((b, sk, hk, d), dtype, device, seed=8)
        v = randn((b, sk, hk, d), dtype, device, seed=9)
        for splits in (0, 3, 16):
            buf, dst = nan_padded(q.shape, dtype, device)
            lse = torch.full((b, h, 1), float("nan"), dtype=F32, device=device)
            kernel.ops.attn_fwd(
                dst, q, k, v, lse, None, None, None, None, None, None, None, 0, 0,
                d**-0.5, 0.0, False, 300, 0, splits,
            )  # fmt: skip
            untouched_past(buf, d, f"{what} decode splits {splits}")
            batch_check(dst, q, k, v, lse, f"{what} decode splits {splits}", window=(300, 0))
        # varlen, GQA, causal window
        lens_q, lens_k = [1, 0, 17, 130], [1, 5, 0, 200]
        cu_q, cu_k = cu_seqlens(lens_q, device), cu_seqlens(lens_k, device)
        h, hk = 4, 2
        q = randn((sum(lens_q), h, d), dtype, device, seed=10)
        k = randn((sum(lens_k), hk, d), dtype, device, seed=11)
        v = randn((sum(lens_k), hk, d), dtype, device, seed=12)
        out, lse, _ = kernel.flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, window_size=(16, -1),
            return_attn_probs=True,
        )  # fmt: skip
        assert out.shape == q.shape
        packed_check(
            out, q, k, v, lens_q, lens_k, f"{what} varlen", lse, causal=True, window=(16, -1)
        )
        # the same into out= with 3 packed rows past the sequences: they keep the caller's
        # values (NaN), or with zero_tensors become 0
        qp = torch.cat([q, randn((3, h, d), dtype, device, seed=15)])
        for zero in (False, True):
            buf, dst = nan_padded(qp.shape, dtype, device)
            got, _ = kernel.ops.varlen_fwd(
                qp, k, v, dst, cu_q, cu_k, None, None, None, None, max(lens_q), max(lens_k), 0.0,
                d**-0.5, zero, True, 16, -1, 0.0, False, None,
            )  # fmt: skip
            assert got.data_ptr() == dst.data_ptr()
            untouched_past(buf, d, f"{what} varlen_fwd out=")
            assert torch.equal(dst[: sum(lens_q)], out), f"{what} varlen_fwd out="
            rest = dst[sum(lens_q) :]
            assert bool((rest == 0).all() if zero else rest.isnan().all()), f"{what} zero {zero}"
        # paged K/V through a block table (vLLM's decode and chunked prefill)
        lens_q, lens_k = [1, 17, 5], [1, 300, 33]
        ks = [randn((n, hk, d), dtype, device, seed=20 + i) for i, n in enumerate(lens_k)]
        vs = [randn((n, hk, d), dtype, device, seed=30 + i) for i, n in enumerate(lens_k)]
        k_cache, v_cache, table = paged_cache(ks, vs, 16, seed=13)
        q = randn((sum(lens_q), h, d), dtype, device, seed=14)
        buf, dst = nan_padded(q.shape, dtype, device)
        kernel.ops.attn_fwd(
            dst, q, k_cache, v_cache, None, cu_seqlens(lens_q, device), None,
            torch.tensor(lens_k, dtype=torch.int32, device=device), table, None, None, None,
            max(lens_q), max(lens_k), d**-0.5, 0.0, True, -1, -1, 0,
        )  # fmt: skip
        untouched_past(buf, d, f"{what} paged")
        sequences_check(
            list(dst.split(lens_q)),
            list(q.split(lens_q)),
            ks,
            vs,
            d**-0.5,
            f"{what} paged",
            causal=True,
        )


def test_split_kv_merge_over_two_query_tiles(kernel, device):
    """Split-KV decode tiles hold up to 32 packed rows (query rows x the q heads of a kv head), so a
    (head, sequence) may have two 16-row tiles, each merged over its own splits (on sm_90+ each
    tile's splits are one thread-block cluster). Varlen queries of 1 to 8 rows (4 to 32 packed
    rows) against ragged keys through seqused_k: the causal diagonal and the short sequences leave
    splits and whole tiles without a visible key. On sm_90+ 2 splits (32 CTAs) merge in clusters;
    the others take the combine kernel. out and lse start as NaN."""
    dtype = dtypes_for(device)[-1]
    h, hk, d = 8, 2, 128
    lens_q = [8, 1, 5, 3]
    lens_k = [2000, 700, 9, 1500]
    cu_q = cu_seqlens(lens_q, device)
    q = randn((sum(lens_q), h, d), dtype, device, seed=31)
    k = randn((len(lens_k), max(lens_k), hk, d), dtype, device, seed=32)
    v = randn((len(lens_k), max(lens_k), hk, d), dtype, device, seed=33)
    used = torch.tensor(lens_k, dtype=torch.int32, device=device)
    for splits in (0, 2, 5, 16):
        out = torch.full_like(q, float("nan"))
        lse = torch.full((h, sum(lens_q)), float("nan"), dtype=F32, device=device)
        kernel.ops.attn_fwd(
            out,
            q,
            k,
            v,
            lse,
            cu_q,
            None,
            used,
            None,
            None,
            None,
            None,
            max(lens_q),
            max(lens_k),
            d**-0.5,
            0.0,
            True,
            -1,
            -1,
            splits,
        )
        sequences_check(
            list(out.split(lens_q)),
            list(q.split(lens_q)),
            [t[:n] for t, n in zip(k, lens_k)],
            [t[:n] for t, n in zip(v, lens_k)],
            d**-0.5,
            f"splits {splits}",
            causal=True,
            lses=list(lse.split(lens_q, dim=1)),
        )


_MERGE_CASES = """
import kernels, torch
kernel = kernels.get_kernel("open-kernels/attention", version=1)
gen = torch.Generator(device="cuda").manual_seed(41)
results = []
for b, sq, sk, h, hk, d, splits, window in ((1, 1, 4096, 32, 8, 128, 4, (-1, -1)), (2, 1, 4500, 8, 2, 256, 3, (200, 0)),
                                            (3, 6, 777, 8, 2, 64, 3, (-1, -1)), (1, 1, 333, 4, 1, 96, 2, (-1, -1))):
    q = torch.randn((b, sq, h, d), generator=gen, device="cuda").bfloat16()
    k = torch.randn((b, sk, hk, d), generator=gen, device="cuda").bfloat16()
    v = torch.randn((b, sk, hk, d), generator=gen, device="cuda").bfloat16()
    out = torch.empty_like(q)
    lse = torch.empty((b, h, sq), dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    kernel.ops.attn_fwd(out, q, k, v, lse, None, None, None, None, None, None, None, 0, 0, d ** -0.5, 0.0, sq > 1,
                        window[0], window[1], splits)
    torch.cuda.synchronize()
    workspace = torch.cuda.max_memory_allocated() - base
    results.append((out.cpu(), lse.cpu(), workspace))
torch.save(results, PATH)
print("ok")
"""

# The first decode calls of a process made inside a CUDA-graph capture (as vLLM captures its decode
# graphs): the plan's device queries (occupancy, clusters, shared-memory opt-in) must not break the
# capture, and the replay must equal eager calls.
_FIRST_CALLS_IN_CAPTURE = """
import kernels, torch
kernel = kernels.get_kernel("open-kernels/attention", version=1)
gen = torch.Generator(device="cuda").manual_seed(3)
q = torch.randn((2, 1, 32, 128), generator=gen, device="cuda").bfloat16()
k_cache = torch.randn((2, 4096, 8, 128), generator=gen, device="cuda").bfloat16()
v_cache = torch.randn((2, 4096, 8, 128), generator=gen, device="cuda").bfloat16()
lens = torch.tensor([4096, 1000], dtype=torch.int32, device="cuda")
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    out = kernel.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens)
graph.replay()
torch.cuda.synchronize()
assert torch.equal(out, kernel.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens))
print("ok")
"""


def test_first_decode_calls_inside_graph_capture(kernel, device):
    if device != "cuda":
        pytest.skip("CUDA graphs")
    run_in_fresh_process(_FIRST_CALLS_IN_CAPTURE)


def test_split_merge_paths_agree(kernel, device, tmp_path, monkeypatch):
    """The two merges of split-KV partial states (the combine kernel, and on sm_90+ the merge inside
    a thread-block cluster) sum the same fp32 partials in different orders: the outputs may differ
    by the final rounding (one bf16 ulp: 2^-7 relative) and the lse by float32 rounding. Each
    path's result is computed in its own fresh process (ATTENTION_CLUSTER_MERGE=0 selects the
    combine kernel everywhere); both are checked against the reference by the tests above. The
    cases are small grids of 2-4 splits, where the plan takes clusters: on sm_90+ the cluster merge
    must have run, which shows as a call that allocates no workspace."""
    if device != "cuda":
        pytest.skip("the merge paths are CUDA's")
    outs = {}
    for mode in ("0", "1"):
        path = tmp_path / f"merge{mode}.pt"
        monkeypatch.setenv("ATTENTION_CLUSTER_MERGE", mode)  # inherited by the fresh process
        run_in_fresh_process(f"PATH = {str(path)!r}\n" + _MERGE_CASES)
        outs[mode] = torch.load(path)
    clusters = torch.cuda.get_device_capability()[0] >= 9
    for (out0, lse0, workspace0), (out1, lse1, workspace1) in zip(outs["0"], outs["1"]):
        assert workspace0 > 0 and (workspace1 == 0) == clusters, (workspace0, workspace1)
        a, b = out0.float(), out1.float()
        assert bool(((a - b).abs() <= 2.0**-7 * torch.maximum(a.abs(), b.abs())).all())
        assert torch.allclose(lse0, lse1, rtol=1e-5, atol=1e-5)


def test_cluster_merge_needs_no_workspace(kernel, device):
    """On sm_90+ a batch-1 decode of 2-4 splits that keep one CTA per SM merges them inside
    thread-block clusters (8 clusters of 4 CTAs here): the call allocates no fp32 partial outputs.
    With more splits the combine kernel's path allocates splits x heads x head_dim floats."""
    if device != "cuda" or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters need sm_90+")
    in_cluster = 4
    q = randn((1, 1, 32, 128), BF16, device, seed=51)
    k = randn((1, 4096, 8, 128), BF16, device, seed=52)
    v = randn((1, 4096, 8, 128), BF16, device, seed=53)
    out = torch.empty_like(q)
    args = (
        out,
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
        128**-0.5,
        0.0,
        False,
        -1,
        -1,
    )
    kernel.ops.attn_fwd(*args, in_cluster)  # warm-up: the plan's device queries
    torch.cuda.synchronize()
    for splits, workspace in ((in_cluster, 0), (8, 8 * 32 * 128 * 4), (17, 17 * 32 * 128 * 4)):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        kernel.ops.attn_fwd(*args, splits)
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base
        if workspace == 0:
            assert extra == 0, f"{splits} splits allocated {extra} bytes"
        else:
            assert extra >= workspace, f"{splits} splits (combine kernel) allocated {extra} bytes"


def test_empty_inputs(kernel, device):
    dtype = dtypes_for(device)[-1]
    for b, sq, sk in ((0, 5, 5), (2, 0, 5)):
        q = randn((b, sq, 2, 32), dtype, device)
        k = randn((b, sk, 2, 32), dtype, device)
        out, lse, _ = kernel.flash_attn_func(q, k, k, causal=True, return_attn_probs=True)
        assert out.shape == q.shape and lse.shape == (b, 2, sq)
    # keys of length 0: out 0, lse +inf
    q = randn((2, 3, 2, 32), dtype, device)
    k = randn((2, 0, 2, 32), dtype, device)
    out, lse, _ = kernel.flash_attn_func(q, k, k, return_attn_probs=True)
    assert bool((out == 0).all()) and bool((lse == float("inf")).all())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="peak memory is measured on CUDA")
def test_peak_memory_is_linear_in_sequence_length(kernel):
    """No S x S buffer: the memory a prefill call allocates beyond its inputs grows 4x from S =
    4K to 16K (the output and lse), not 16x."""
    extra = {}
    for s in (4096, 16384):
        q, k, v = (randn((1, s, 16, 128), BF16, "cuda", seed=i) for i in range(3))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = kernel.flash_attn_func(q, k, v, causal=True)
        torch.cuda.synchronize()
        extra[s] = torch.cuda.max_memory_allocated() - base
        del q, k, v, out
    out_bytes = 16384 * 16 * 128 * 2
    assert extra[16384] <= 4.5 * extra[4096] and extra[16384] <= 2 * out_bytes, extra
