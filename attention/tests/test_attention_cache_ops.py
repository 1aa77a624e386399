"""vLLM's KV-cache writers: reshape_and_cache (paged layout, key split into x-element groups) and
reshape_and_cache_flash (flash layout), against a plain-PyTorch re-implementation of vLLM's
semantics: token t's rows go to slot slot_mapping[t] (block s // block_size, row s % block_size),
-1 skips the token, only the first slot_mapping.size(0) tokens are written, and every value is
copied bit for bit; every other cache element keeps its bits (caches pre-filled with random
values)."""

import pytest
import torch
from attention_cases import dtype_id, dtypes_for, expect_raises, gen, randn


def _slots(num_tokens, num_blocks, block_size, seed, skip=(), dtype=torch.int64):
    slots = torch.randperm(num_blocks * block_size, generator=gen(seed))[:num_tokens]
    for t in skip:
        slots[t] = -1
    return slots.to(dtype)


def _expected_flash(key, value, k_cache, v_cache, slots):
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    bs = k_cache.shape[1]
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            k_ref[s // bs, s % bs] = key[t]
            v_ref[s // bs, s % bs] = value[t]
    return k_ref, v_ref


def _expected_paged(key, value, k_cache, v_cache, slots):
    """vLLM: key_cache[block, h, d // x, row, d % x], value_cache[block, h, d, row]."""
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    bs, x = k_cache.shape[3], k_cache.shape[4]
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            blk, row = s // bs, s % bs
            k_ref[blk, :, :, row, :] = key[t].reshape(key.shape[1], -1, x)
            v_ref[blk, :, :, row] = value[t]
    return k_ref, v_ref


@pytest.mark.kernels_ci
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("block_size", [16, 5])
def test_reshape_and_cache_flash(kernel, device, block_size, slot_dtype):
    tokens, heads, d, blocks = 23, 3, 64, 9
    for dtype in dtypes_for(device):
        key = randn(
            (tokens + 4, heads, d), dtype, device, seed=1
        )  # 4 padding tokens past slot_mapping
        value = randn((tokens + 4, heads, d), dtype, device, seed=2)
        k_cache = randn((blocks, block_size, heads, d), dtype, device, seed=3)
        v_cache = randn((blocks, block_size, heads, d), dtype, device, seed=4)
        slots = _slots(tokens, blocks, block_size, 5, skip=(0, 7), dtype=slot_dtype).to(device)
        k_ref, v_ref = _expected_flash(key, value, k_cache, v_cache, slots)
        kernel.reshape_and_cache_flash(key, value, k_cache, v_cache, slots, "auto")
        assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref), dtype_id(dtype)


def test_reshape_and_cache_flash_strided(kernel, device):
    """Views: key / value columns of a fused qkv projection; caches as the two halves of vLLM's
    [num_blocks, 2, block_size, H, D] KV tensor (non-contiguous, interleaved in memory)."""
    tokens, heads, d, blocks, bs = 11, 2, 32, 4, 8
    dtype = dtypes_for(device)[-1]
    qkv = randn((tokens, 3 * heads * d), dtype, device, seed=1)
    key = qkv[:, heads * d : 2 * heads * d].unflatten(-1, (heads, d))
    value = qkv[:, 2 * heads * d :].unflatten(-1, (heads, d))
    kv = randn((blocks, 2, bs, heads, d), dtype, device, seed=2)
    k_cache, v_cache = kv[:, 0], kv[:, 1]
    slots = _slots(tokens, blocks, bs, 3).to(device)
    k_ref, v_ref = _expected_flash(key, value, k_cache, v_cache, slots)
    kernel.reshape_and_cache_flash(key, value, k_cache, v_cache, slots)
    assert torch.equal(kv[:, 0], k_ref) and torch.equal(kv[:, 1], v_ref)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("x", [8, 4, 16])
def test_reshape_and_cache(kernel, device, x):
    tokens, heads, d, blocks, bs = 19, 4, 32, 6, 16
    for dtype in dtypes_for(device):
        key = randn((tokens, heads, d), dtype, device, seed=1)
        value = randn((tokens, heads, d), dtype, device, seed=2)
        k_cache = randn((blocks, heads, d // x, bs, x), dtype, device, seed=3)
        v_cache = randn((blocks, heads, d, bs), dtype, device, seed=4)
        slots = _slots(tokens, blocks, bs, 5, skip=(3,)).to(device)
        k_ref, v_ref = _expected_paged(key, value, k_cache, v_cache, slots)
        kernel.reshape_and_cache(
            key, value, k_cache, v_cache, slots, "auto", torch.ones(1), torch.ones(1)
        )
        assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref), dtype_id(dtype)


@pytest.mark.parametrize("head_dim", [40, 59, 80])
def test_cache_writers_any_head_dim(kernel, device, head_dim):
    """Both layouts at head dims other than the attention kernels' instances (59: not a multiple of
    the 16-byte group, so the key's x is 1 in vLLM's layout)."""
    tokens, heads, d, blocks, bs = 13, 2, head_dim, 5, 8
    x = 8 if d % 8 == 0 else 1
    dtype = dtypes_for(device)[-1]
    key = randn((tokens, heads, d), dtype, device, seed=1)
    value = randn((tokens, heads, d), dtype, device, seed=2)
    slots = _slots(tokens, blocks, bs, 5, skip=(2,)).to(device)
    k_cache = randn((blocks, bs, heads, d), dtype, device, seed=3)
    v_cache = randn((blocks, bs, heads, d), dtype, device, seed=4)
    k_ref, v_ref = _expected_flash(key, value, k_cache, v_cache, slots)
    kernel.reshape_and_cache_flash(key, value, k_cache, v_cache, slots, "auto")
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref), "flash layout"
    k_cache = randn((blocks, heads, d // x, bs, x), dtype, device, seed=5)
    v_cache = randn((blocks, heads, d, bs), dtype, device, seed=6)
    k_ref, v_ref = _expected_paged(key, value, k_cache, v_cache, slots)
    kernel.reshape_and_cache(key, value, k_cache, v_cache, slots, "auto")
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref), "vLLM's paged layout"


def test_paged_writes_feed_paged_attention(kernel, device):
    """reshape_and_cache_flash then flash_attn_varlen_func with the matching block table: the
    keys written are the keys read (vLLM's prefill then decode flow)."""
    dtype = dtypes_for(device)[-1]
    heads, hk, d, bs, blocks = 4, 2, 64, 16, 12
    lens = [30, 7]
    table = torch.tensor([[3, 9, 0, 0], [5, 0, 0, 0]], dtype=torch.int32, device=device)
    slots = torch.cat(
        [
            table[b, torch.arange(n) // bs].long() * bs + torch.arange(n, device=device) % bs
            for b, n in enumerate(lens)
        ]
    )
    key = randn((sum(lens), hk, d), dtype, device, seed=1)
    value = randn((sum(lens), hk, d), dtype, device, seed=2)
    k_cache = torch.zeros((blocks, bs, hk, d), dtype=dtype, device=device)
    v_cache = torch.zeros_like(k_cache)
    kernel.reshape_and_cache_flash(key, value, k_cache, v_cache, slots)
    q = randn((len(lens), heads, d), dtype, device, seed=3)
    cu_q = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    used = torch.tensor(lens, dtype=torch.int32, device=device)
    got = kernel.flash_attn_varlen_func(
        q,
        k_cache,
        v_cache,
        cu_q,
        None,
        1,
        max(lens),
        seqused_k=used,
        block_table=table,
        causal=True,
    )
    cu_k = torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32, device=device)
    want = kernel.flash_attn_varlen_func(q, key, value, cu_q, cu_k, 1, max(lens), causal=True)
    assert torch.equal(got, want)


def test_bad_inputs(kernel, device):
    dtype = dtypes_for(device)[-1]
    key = randn((4, 2, 32), dtype, device)
    k_cache = randn((3, 8, 2, 32), dtype, device)
    v_cache = randn((3, 8, 2, 32), dtype, device)
    slots = torch.tensor([0, 1, 2, 3], device=device)
    f = kernel.reshape_and_cache_flash
    with pytest.raises(NotImplementedError, match="kv_cache_dtype"):
        f(key, key, k_cache, v_cache, slots, "fp8")
    with expect_raises("key_cache"):
        f(key, key, k_cache.float() if dtype != torch.float32 else k_cache.half(), v_cache, slots)
    with expect_raises("value_cache"):
        f(key, key, k_cache, v_cache[:, :, :1], slots)
    with expect_raises("slot_mapping"):
        f(key, key, k_cache, v_cache, slots.float())
    with expect_raises("slot_mapping"):
        f(key, key, k_cache, v_cache, torch.arange(5, device=device))  # more slots than tokens
    with expect_raises("key"):
        f(randn((4, 2, 64), dtype, device)[..., ::2], key, k_cache, v_cache, slots)
    with expect_raises("key_cache"):
        kernel.reshape_and_cache(
            key, key, k_cache, v_cache, slots
        )  # flash layout where vLLM's is expected
    # A slot past the 3 x 8 = 24 slots. CPU: raises, nothing written. CUDA: the kernel skips that
    # token and records the error, which the next call on the device raises.
    bad = torch.tensor([0, 1, 24, 2], device=device)
    k0, v0 = k_cache.clone(), v_cache.clone()
    if device == "cpu":
        with expect_raises("slot_mapping"):
            f(key, key, k_cache, v_cache, bad)
        assert torch.equal(k_cache, k0), "nothing is written when a slot is out of range"
        return
    kernel.check_kvcache_errors()
    f(key, key, k_cache, v_cache, bad)
    torch.cuda.synchronize()  # no device assertion: the context is intact
    k_ref, v_ref = _expected_flash(key, key, k0, v0, torch.tensor([0, 1, -1, 2]))
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref), "only slot 24 is skipped"
    with expect_raises("slot_mapping"):
        f(key, key, k_cache, v_cache, slots)
    kernel.check_kvcache_errors()  # raised once, then cleared
