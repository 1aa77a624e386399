"""flash_attn_with_kvcache: decode over a cache with per-sequence lengths, appending new k / v
(in place, at cache_seqlens), the rotary embedding of the new keys and of q, cache_batch_idx,
cache_leftpad, paged caches (block sizes 16, 256 and 5), num_splits and the lse.

The cache update is checked bit for bit: values are copied unchanged, and a rotated key is
a cos - b sin / b cos + a sin evaluated in float32 (each product and the sum rounded, no FMA)
and rounded once to the dtype, which `rotate_like_kernel` reproduces exactly with PyTorch
float32 ops. The attention output is checked against the float64 reference over the updated
cache rows with the bound of attention_cases.py, using that same rotated q.
"""

import pytest
import torch
from attention_cases import (
    BF16,
    F32,
    alibi_slopes,
    dtype_id,
    dtypes_for,
    paged_cache,
    randn,
    rotary_tables,
    sequences_check,
)


def rotate_like_kernel(x, cos, sin, positions, interleaved):
    """x [S, H, D] rotated at rows positions [S]: float32 products and sum, one rounding to x's
    dtype (the kernels' arithmetic, see the module docstring)."""
    rot = 2 * cos.shape[1]
    c = cos.float().cpu()[positions.cpu().long()][:, None, :]
    s = sin.float().cpu()[positions.cpu().long()][:, None, :]
    xf = x.detach().cpu().float()
    r, rest = xf[..., :rot], x.detach().cpu()[..., rot:]
    if interleaved:
        a, b = r[..., 0::2], r[..., 1::2]
    else:
        a, b = r[..., : rot // 2], r[..., rot // 2 :]
    na = (a * c - b * s).to(x.dtype)
    nb = (b * c + a * s).to(x.dtype)
    r = torch.stack([na, nb], dim=-1).flatten(-2) if interleaved else torch.cat([na, nb], dim=-1)
    return torch.cat([r, rest], dim=-1)


def _setup(device, dtype, batch, cache_len, h, hk, d, seed=0, cache_batch=None):
    cache_batch = cache_batch or batch
    k_cache = randn((cache_batch, cache_len, hk, d), dtype, device, seed=seed + 1)
    v_cache = randn((cache_batch, cache_len, hk, d), dtype, device, seed=seed + 2)
    return k_cache, v_cache


def _check(
    kernel,
    device,
    dtype,
    *,
    batch=3,
    h=8,
    hk=2,
    d=64,
    cache_len=97,
    new=0,
    causal=True,
    rotary=None,
    rotary_dtype=None,
    batch_idx=False,
    leftpad=False,
    block_size=None,
    window=(-1, -1),
    softcap=0.0,
    alibi=False,
    num_splits=0,
    seqlen_q=None,
    seed=0,
):
    """One flash_attn_with_kvcache call checked end to end (cache rows and output)."""
    seqlen_q = seqlen_q or max(new, 1)
    gen = torch.Generator().manual_seed(seed)
    cache_batch = batch + 2 if batch_idx else batch
    seqlens = torch.randint(0, cache_len - new + 1, (batch,), generator=gen).tolist()
    seqlens[0] = cache_len - new  # one sequence fills its cache
    pads = [torch.randint(0, s + 1, (1,), generator=gen).item() if leftpad else 0 for s in seqlens]
    idx = (
        torch.randperm(cache_batch, generator=gen)[:batch].tolist()
        if batch_idx
        else list(range(batch))
    )
    q = randn((batch, seqlen_q, h, d), dtype, device, seed=seed + 3)
    k_new = randn((batch, new, hk, d), dtype, device, seed=seed + 4) if new else None
    v_new = randn((batch, new, hk, d), dtype, device, seed=seed + 5) if new else None

    # the logical caches [cache_batch][cache_len] (before the update)
    k_log, v_log = _setup(
        device, dtype, batch, cache_len, h, hk, d, seed=seed, cache_batch=cache_batch
    )
    if block_size is None:
        k_cache, v_cache, table = k_log.clone(), v_log.clone(), None
    else:
        # paged: one block list per sequence (cache_batch_idx does not apply)
        k_cache, v_cache, table = paged_cache(
            list(k_log[:batch]), list(v_log[:batch]), block_size, seed=seed + 6
        )
        k_log, v_log = k_log[:batch], v_log[:batch]
    cos = sin = None
    if rotary is not None:
        rot_dim, interleaved = rotary
        cos, sin = rotary_tables(cache_len + seqlen_q, rot_dim, rotary_dtype or dtype, device)
    slopes = alibi_slopes(h, device, batch=batch) if alibi else None
    k_before = k_cache.clone()

    out, lse = kernel.flash_attn_with_kvcache(
        q,
        k_cache,
        v_cache,
        k_new,
        v_new,
        rotary_cos=cos,
        rotary_sin=sin,
        cache_seqlens=torch.tensor(seqlens, dtype=torch.int32, device=device),
        cache_batch_idx=torch.tensor(idx, dtype=torch.int32, device=device) if batch_idx else None,
        cache_leftpad=torch.tensor(pads, dtype=torch.int32, device=device) if leftpad else None,
        block_table=table,
        causal=causal,
        window_size=window,
        softcap=softcap,
        rotary_interleaved=rotary[1] if rotary else True,
        alibi_slopes=slopes,
        num_splits=num_splits,
        return_softmax_lse=True,
    )
    what = f"{dtype_id(dtype)} new={new} rotary={rotary} paged={block_size}"
    q_seqs, k_seqs, v_seqs = [], [], []
    for b in range(batch):
        cb = idx[b]
        ks, vs = k_log[cb].clone(), v_log[cb].clone()
        if new:
            pos = torch.arange(seqlens[b], seqlens[b] + new)
            kn = (
                rotate_like_kernel(k_new[b], cos, sin, pos, rotary[1]) if rotary else k_new[b].cpu()
            )
            ks[seqlens[b] : seqlens[b] + new] = kn.to(device)
            vs[seqlens[b] : seqlens[b] + new] = v_new[b]
            # the cache itself: new rows written exactly, nothing else touched
            if block_size is None:
                got_k, got_v = k_cache[cb], v_cache[cb]
            else:
                blocks = table[b].long()
                got_k = k_cache[blocks].flatten(0, 1)[:cache_len]
                got_v = v_cache[blocks].flatten(0, 1)[:cache_len]
            assert torch.equal(got_k, ks), f"{what}: k_cache rows of sequence {b}"
            assert torch.equal(got_v, vs), f"{what}: v_cache rows of sequence {b}"
        qb = q[b]
        if rotary:
            per_token = causal or window[0] >= 0 or window[1] >= 0
            pos = seqlens[b] + (
                torch.arange(seqlen_q) if per_token else torch.zeros(seqlen_q, dtype=torch.long)
            )
            qb = rotate_like_kernel(qb, cos, sin, pos, rotary[1]).to(device)
        end = seqlens[b] + new
        q_seqs.append(qb)
        k_seqs.append(ks[pads[b] : end])
        v_seqs.append(vs[pads[b] : end])
    if block_size is None and batch_idx:
        untouched = [i for i in range(cache_batch) if i not in idx]
        assert torch.equal(k_cache[untouched], k_before[untouched]), (
            f"{what}: other caches were written"
        )
    sequences_check(
        list(out.unbind(0)),
        q_seqs,
        k_seqs,
        v_seqs,
        d**-0.5,
        what,
        causal=causal,
        window=window,
        softcap=softcap,
        slopes=None if slopes is None else list(slopes.unbind(0)),
        lses=list(lse.unbind(0)),
    )


@pytest.mark.kernels_ci
def test_decode_over_cache(kernel, device):
    for dtype in dtypes_for(device):
        _check(kernel, device, dtype, new=0)


@pytest.mark.parametrize("new", [1, 5])
@pytest.mark.parametrize("causal", [True, False])
def test_append(kernel, device, new, causal):
    for dtype in dtypes_for(device):
        _check(kernel, device, dtype, new=new, causal=causal, seed=new)


@pytest.mark.parametrize(
    "rotary",
    [(64, True), (64, False), (32, True), (32, False)],
    ids=lambda r: f"rot{r[0]}_{'gptj' if r[1] else 'neox'}",
)
@pytest.mark.parametrize("causal", [True, False])
def test_append_rotary(kernel, device, rotary, causal):
    for dtype in dtypes_for(device):
        _check(kernel, device, dtype, new=3, causal=causal, rotary=rotary, seed=2)
    # float32 tables with half activations
    _check(kernel, device, BF16, new=2, causal=causal, rotary=rotary, rotary_dtype=F32, seed=4)


def test_cache_batch_idx_and_leftpad(kernel, device):
    for dtype in dtypes_for(device):
        _check(kernel, device, dtype, new=2, batch_idx=True, seed=5)
        _check(kernel, device, dtype, new=2, leftpad=True, rotary=(64, True), seed=6)
        _check(kernel, device, dtype, new=0, leftpad=True, batch_idx=True, seed=7)


@pytest.mark.parametrize("block_size", [16, 256, 5])
def test_paged(kernel, device, block_size):
    for dtype in dtypes_for(device):
        _check(kernel, device, dtype, new=0, block_size=block_size, cache_len=300, seed=8)
        _check(
            kernel,
            device,
            dtype,
            new=4,
            block_size=block_size,
            cache_len=300,
            rotary=(32, False),
            seed=9,
        )


def test_options_and_splits(kernel, device):
    dtype = dtypes_for(device)[-1]
    _check(kernel, device, dtype, new=1, window=(16, 0), softcap=5.0, alibi=True, seed=10)
    _check(kernel, device, dtype, new=6, seqlen_q=6, causal=True, window=(8, 0), seed=11)
    for splits in (0, 1, 4):
        _check(
            kernel, device, dtype, batch=2, hk=1, cache_len=700, new=1, num_splits=splits, seed=12
        )


@pytest.mark.parametrize("head_dim", [40, 59, 80, 160, 224])
def test_head_dims_between_instances(kernel, device, head_dim):
    """Head dims without a CUDA instance of their own (the next instantiated one runs with the
    columns past head_dim zero-filled; 59 on zero-padded copies of q and the caches): decode over a
    paged cache with an append and the rotary embedding, and split-KV decode over a contiguous
    cache (0: the kernel's choice, 3: on sm_90+ merged in a cluster, 16: the combine kernel). The
    appended rows are checked bit for bit, the columns past rotary_dim copied."""
    dtype = dtypes_for(device)[-1]
    d = head_dim
    _check(
        kernel, device, dtype, d=d, new=1, block_size=16, cache_len=300, rotary=(32, False), seed=13
    )
    _check(kernel, device, dtype, d=d, new=3, causal=True, rotary=(32, True), seed=14)
    for splits in (0, 3, 16):
        _check(
            kernel, device, dtype, d=d, batch=2, hk=1, cache_len=1500, new=1, num_splits=splits,
            seed=15,
        )  # fmt: skip


def test_int_cache_seqlens_and_low_level_op(kernel, device):
    dtype = dtypes_for(device)[-1]
    b, s, h, d = 2, 40, 4, 32
    q = randn((b, 1, h, d), dtype, device, seed=1)
    k_cache = randn((b, s, h, d), dtype, device, seed=2)
    v_cache = randn((b, s, h, d), dtype, device, seed=3)
    out = kernel.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=25)
    sequences_check(
        list(out.unbind(0)),
        q.unbind(0),
        list(k_cache[:, :25]),
        list(v_cache[:, :25]),
        d**-0.5,
        "int cache_seqlens",
    )
    # no cache_seqlens: every cache row is a key
    out = kernel.flash_attn_with_kvcache(q, k_cache, v_cache)
    sequences_check(
        list(out.unbind(0)),
        q.unbind(0),
        k_cache.unbind(0),
        v_cache.unbind(0),
        d**-0.5,
        "full caches",
    )
    seqlens = torch.tensor([25, 25], dtype=torch.int32, device=device)
    got, lse = kernel.ops.fwd_kvcache(
        q,
        k_cache,
        v_cache,
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
        d**-0.5,
        False,
        -1,
        -1,
        0.0,
        True,
        0,
    )
    want, want_lse = kernel.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=25, return_softmax_lse=True
    )
    assert torch.equal(got, want) and torch.equal(lse, want_lse)
