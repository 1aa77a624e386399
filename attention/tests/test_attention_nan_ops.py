"""NaN propagation of the attention forward, as in PyTorch's SDPA.

A NaN in a query row makes that row's output and lse NaN; a NaN in a key (K) that a row sees makes
that row's output and lse NaN; a NaN in a value (V) that a row sees makes its output NaN (its lse,
which V does not enter, stays). Nothing else changes: every other row is bit for bit the output
of the same call without the NaN, a key that a row cannot see (causal mask, window, past its
sequence's length) never reaches it, and a row without a visible key stays out 0, lse +inf.
(Before, a NaN score was taken for an empty row: out 0, lse +inf.)

The cases run on the kernel's device (the `device` fixture): the CPU kernel, or the CUDA kernel's
paths (prefill and decode tiles, key-split warps, split-KV with the combine kernel: num_splits 8,
and on sm_90+ the merge inside a thread-block cluster: num_splits 3 on a contiguous cache). On
CUDA a NaN in V at a key hidden from a row by the causal mask or window may still reach the row
when the key shares a key tile with visible ones (0 x NaN in the P V product, as in SDPA's math
backend); only the CPU is checked for that.
"""

import pytest
import torch
from attention_cases import dtype_id, dtypes_for, randn, visible

NAN = float("nan")


def _row_nan(out: torch.Tensor) -> torch.Tensor:
    """[B, S, H, D] -> [B, S, H]: rows with a NaN anywhere."""
    return torch.isnan(out.float()).any(dim=-1)


def _check(out, lse, clean_out, clean_lse, nan_rows, lse_nan_rows, what, whole_row=True):
    """nan_rows [B, S, H] (bool): the rows whose output must be NaN (in every column, or with
    whole_row=False, a NaN in one column of V: somewhere); lse_nan_rows [B, H, S]: the lse entries
    that must be NaN. Every other row / lse entry equals the clean call's bit for bit."""
    out, lse = out.cpu(), lse.cpu()
    clean_out, clean_lse = clean_out.cpu(), clean_lse.cpu()
    isnan = torch.isnan(out.float())
    assert torch.equal(_row_nan(out), nan_rows), f"{what}: rows with a NaN"
    if whole_row:
        assert bool(isnan[nan_rows].all()), f"{what}: a NaN row is NaN in every column"
    assert torch.equal(out[~nan_rows], clean_out[~nan_rows]), f"{what}: the other rows changed"
    assert torch.equal(torch.isnan(lse), lse_nan_rows), f"{what}: NaN lse entries"
    assert torch.equal(lse[~lse_nan_rows], clean_lse[~lse_nan_rows]), (
        f"{what}: the other lse changed"
    )


MASKS = {
    "full": (False, (-1, -1)),
    "causal": (True, (-1, -1)),
    "window": (False, (8, 3)),
    "causal_window": (True, (8, -1)),
}


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("head_dim", [64, 80, 128])
def test_prefill_nan(kernel, device, mask, head_dim):
    """Head dim 80 runs CUDA's head-dim-96 kernel, whose extra columns of K and V repeat their last
    8 columns (attention_tile.cuh): the NaN in K and V is put there, in the last column."""
    causal, window = MASKS[mask]
    batch, len_q, len_k, h, hk = 2, 77, 93, 4, 2
    group = h // hk
    vis = visible(len_q, len_k, causal, window)  # [S_q, S_k]
    for dtype in dtypes_for(device):
        what = f"{mask} D{head_dim} {dtype_id(dtype)}"
        q = randn((batch, len_q, h, head_dim), dtype, device, seed=1)
        k = randn((batch, len_k, hk, head_dim), dtype, device, seed=2)
        v = randn((batch, len_k, hk, head_dim), dtype, device, seed=3)

        def run(q_, k_, v_):
            out, lse, _ = kernel.flash_attn_func(
                q_, k_, v_, causal=causal, window_size=window, return_attn_probs=True
            )
            return out, lse

        clean_out, clean_lse = run(q, k, v)
        empty = ~vis.any(dim=1)  # rows without a visible key

        # NaN in one query row: that row only (unless it sees no key).
        bq, iq, hq = 1, 40, 3
        qn = q.clone()
        qn[bq, iq, hq, 5] = NAN
        rows = torch.zeros(batch, len_q, h, dtype=torch.bool)
        rows[bq, iq, hq] = not bool(empty[iq])
        out, lse = run(qn, k, v)
        _check(out, lse, clean_out, clean_lse, rows, rows.permute(0, 2, 1), what + ": NaN in q")

        # NaN in one key (K) of kv head 1: the rows of that head's group that see the key.
        bk, jk, hkv = 0, 50, 1
        kn = k.clone()
        kn[bk, jk, hkv, -1] = NAN
        rows = torch.zeros(batch, len_q, h, dtype=torch.bool)
        for g in range(group):
            rows[bk, :, hkv * group + g] = vis[:, jk]
        assert rows.any() and (mask == "full" or (~rows[bk, :, hkv * group]).any()), (
            "seen by some rows, not all"
        )
        out, lse = run(q, kn, v)
        _check(out, lse, clean_out, clean_lse, rows, rows.permute(0, 2, 1), what + ": NaN in k")

        # NaN in the same value (V): the output of the same rows; the lse does not change.
        vn = v.clone()
        vn[bk, jk, hkv, -1] = NAN
        out, lse = run(q, k, vn)
        if device == "cpu":
            _check(
                out,
                lse,
                clean_out,
                clean_lse,
                rows,
                torch.zeros_like(clean_lse, dtype=torch.bool),
                what + ": NaN in v",
                whole_row=False,
            )
        else:  # masked rows of the key's tile may see 0 x NaN (module docstring)
            assert bool(_row_nan(out.cpu())[rows].all()), (
                what + ": NaN in v reaches the rows that see it"
            )
            assert torch.equal(lse.cpu(), clean_lse.cpu()), what + ": NaN in v leaves the lse"


@pytest.mark.parametrize("causal", [True, False])
def test_rows_without_keys_stay_empty(kernel, device, causal):
    """len_q > len_k with a causal mask (bottom-right): the first len_q - len_k rows see no key and
    stay out 0, lse +inf while NaN in q and in K reaches the rows that see it. Without the mask, a
    window that hides key 0 from the last rows."""
    batch, len_q, len_k, h, hk, d = 1, 70, 30, 2, 1, 64
    window = (-1, -1) if causal else (5, 0)
    vis = visible(len_q, len_k, causal, window)
    empty = ~vis.any(dim=1)
    for dtype in dtypes_for(device):
        q = randn((batch, len_q, h, d), dtype, device, seed=4)
        k = randn((batch, len_k, hk, d), dtype, device, seed=5)
        v = randn((batch, len_k, hk, d), dtype, device, seed=6)
        q[0, :, 1] = NAN  # every row of head 1
        k[0, 0, 0, 0] = NAN  # key 0, seen by the first rows that see any key
        out, lse, _ = kernel.flash_attn_func(
            q, k, v, causal=causal, window_size=window, return_attn_probs=True
        )
        out, lse = out.cpu().float(), lse.cpu()
        nan_rows = torch.zeros(batch, len_q, h, dtype=torch.bool)
        nan_rows[0, :, 1] = ~empty
        nan_rows[0, :, 0] = vis[:, 0]
        assert torch.equal(_row_nan(out), nan_rows), dtype_id(dtype)
        assert torch.equal(torch.isnan(lse), nan_rows.permute(0, 2, 1)), dtype_id(dtype)
        assert bool(empty.any())
        assert bool((out[0, empty] == 0).all()), "rows without a visible key: out 0"
        assert bool((lse[0][:, empty] == float("inf")).all()), (
            "rows without a visible key: lse +inf"
        )
        # rows of head 0 that see keys but not key 0: finite
        seen = ~empty & ~vis[:, 0]
        if not causal:
            assert bool(seen.any())
        assert bool(torch.isfinite(out[0, seen, 0]).all()) and bool(
            torch.isfinite(lse[0, 0, seen]).all()
        )


@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_decode_split_kv_nan(kernel, device, num_splits, paged):
    """flash_attn_with_kvcache, one query token over a cache of several key tiles: single pass
    (num_splits 1), split-KV merged by the combine kernel (8; paged 3), or inside a cluster on
    sm_90+ (contiguous 3). The CPU ignores num_splits."""
    batch, cache_len, h, hk, d = 2, 700, 8, 2, 128
    group = h // hk
    seqlens = [690, 650]
    for dtype in dtypes_for(device):
        what = f"splits {num_splits} {'paged' if paged else 'contiguous'} {dtype_id(dtype)}"
        q = randn((batch, 1, h, d), dtype, device, seed=7)
        k_cache = randn((batch, cache_len, hk, d), dtype, device, seed=8)
        v_cache = randn((batch, cache_len, hk, d), dtype, device, seed=9)
        cache_seqlens = torch.tensor(seqlens, dtype=torch.int32, device=device)

        def run(q_, k_, v_):
            kwargs = {}
            if paged:
                block = 16
                nb = cache_len // block + 1
                perm = torch.randperm(batch * nb, generator=torch.Generator().manual_seed(3))
                table = perm.view(batch, nb).to(torch.int32)
                kp = torch.zeros((batch * nb, block, hk, d), dtype=dtype, device=device)
                vp = torch.zeros_like(kp)
                for b in range(batch):
                    for n in range(nb):
                        rows = slice(n * block, min((n + 1) * block, cache_len))
                        cnt = rows.stop - rows.start
                        if cnt > 0:
                            kp[table[b, n], :cnt] = k_[b, rows]
                            vp[table[b, n], :cnt] = v_[b, rows]
                k_, v_ = kp, vp
                kwargs["block_table"] = table.to(device)
            return kernel.flash_attn_with_kvcache(
                q_,
                k_,
                v_,
                cache_seqlens=cache_seqlens,
                num_splits=num_splits,
                return_softmax_lse=True,
                **kwargs,
            )

        clean_out, clean_lse = run(q, k_cache, v_cache)
        none = torch.zeros(batch, 1, h, dtype=torch.bool)

        qn = q.clone()
        qn[0, 0, 5, 9] = NAN
        rows = none.clone()
        rows[0, 0, 5] = True
        out, lse = run(qn, k_cache, v_cache)
        _check(out, lse, clean_out, clean_lse, rows, rows.permute(0, 2, 1), what + ": NaN in q")

        # K of sequence 1, kv head 1, key 300 (visible): q heads 4..7 of that sequence.
        rows = none.clone()
        rows[1, 0, group:] = True
        kn = k_cache.clone()
        kn[1, 300, 1, 0] = NAN
        out, lse = run(q, kn, v_cache)
        _check(out, lse, clean_out, clean_lse, rows, rows.permute(0, 2, 1), what + ": NaN in k")

        vn = v_cache.clone()
        vn[1, 300, 1, 0] = NAN
        out, lse = run(q, k_cache, vn)
        _check(
            out,
            lse,
            clean_out,
            clean_lse,
            rows,
            torch.zeros_like(rows.permute(0, 2, 1)),
            what + ": NaN in v",
            whole_row=False,
        )

        # Past the sequence's length (key 680 of sequence 1, cache_seqlens 650): nothing.
        kn = k_cache.clone()
        vn = v_cache.clone()
        kn[1, 680, 1, 0] = NAN
        vn[1, 680, 1, 0] = NAN
        out, lse = run(q, kn, vn)
        _check(
            out,
            lse,
            clean_out,
            clean_lse,
            none,
            none.permute(0, 2, 1),
            what + ": NaN past the length",
        )
