"""Shared test data, the float64 reference and the error model of the attention tests (no kernel
code; written from kernel_src/attention_params.h, independently of the package's _reference).

Reference. `ref_attention` evaluates one sequence in float64 with an explicit softmax over the
[S_q, S_k] score matrix: s = scale * q k^T, softcap * tanh(s / softcap), minus the ALiBi term
slope * |i + S_k - S_q - j|, the bottom-right aligned causal / window mask, p = softmax(s),
out = p v, lse = logsumexp(s). It runs on the kernel's own inputs (already in the test dtype),
so the reference has no rounding error of its own that matters (float64).

Error model. The issue's bound: the kernel's error against that reference may be at most twice
the error PyTorch itself makes in the same dtype (`pytorch_attention`: scaled_dot_product_attention
in the test dtype, or the same formula op by op where SDPA has no equivalent, i.e. softcap),
plus an absolute floor:

    max |ours - ref| <= 2 * max |pytorch - ref| + FLOOR * max |v|

FLOOR = 2**-20 = 8 float32 ulps at 1.0 (2**-23), times max |v|. Why a floor: in float32 both
errors are a handful of float32 roundings; PyTorch's SDPA sums with BLAS blocking and is on some
draws luckier than a sequential online softmax by more than a factor 2 (the largest excess seen
over this suite's float32 cases: 0.85 float32 ulps of max |v|, a decode with a window), so the
bare factor would fail at random on results correct to ~1e-7. Why that size: an output is a
convex combination of rows of v (|out| <= max |v|), accumulated in float32 over up to S_k terms;
8 ulps is about 10 times the excess seen, and it is 2**-10 of one float16 ulp and 2**-13 of one
bfloat16 ulp (for the half dtypes the excess seen is 0: there the test is the factor 2 alone).

lse (float32 in every dtype) is checked against the float64 reference directly:
|lse - ref| <= LSE_TOL * (1 + |ref|) with LSE_TOL = 2**-17 (~16 float32 ulps: the score sum of
D products, one exp / log, the running max), or exactly +inf for a row that sees no key.
"""

import math
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
FLOOR = 2.0**-20
LSE_TOL = 2.0**-17
# The unit roundoff of each dtype (the gradient tests' floor is a multiple of it).
UNIT = {F32: 2.0**-24, F16: 2.0**-11, BF16: 2.0**-8}


def dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def dtypes_for(device: str) -> List[torch.dtype]:
    return [F16, BF16] if device == "cuda" else [F32, F16, BF16]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(shape, dtype, device, seed=0, scale=1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen(seed), dtype=torch.float32) * scale).to(
        device=device, dtype=dtype
    )


def alibi_slopes(heads: int, device, batch: Optional[int] = None, seed: int = 7) -> torch.Tensor:
    """float32 slopes in [0, 0.3) (flash-attn's test range), [H] or [B, H]."""
    shape = (heads,) if batch is None else (batch, heads)
    return (torch.rand(shape, generator=gen(seed)) * 0.3).to(device)


# ---- the float64 reference, one sequence ----


def visible(len_q: int, len_k: int, causal: bool, window=(-1, -1)) -> torch.Tensor:
    """[len_q, len_k] bool: key j visible from query i (bottom-right aligned)."""
    i = torch.arange(len_q)[:, None]
    j = torch.arange(len_k)[None, :]
    diag = i + len_k - len_q
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    ok = torch.ones(len_q, len_k, dtype=torch.bool)
    if left >= 0:
        ok &= j >= diag - left
    if right >= 0:
        ok &= j <= diag + right
    return ok


def bias(len_q: int, len_k: int, slopes: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """ALiBi [H, len_q, len_k]: -slope * |i + len_k - len_q - j| (float64)."""
    if slopes is None:
        return None
    i = torch.arange(len_q)[:, None]
    j = torch.arange(len_k)[None, :]
    dist = (i + len_k - len_q - j).abs().double()
    return -slopes.double().cpu()[:, None, None] * dist


def ref_attention(q, k, v, scale, causal=False, window=(-1, -1), softcap=0.0, slopes=None):
    """One sequence: q [S_q, H, D], k / v [S_k, H_kv, D] -> (out [S_q, H, D], lse [H, S_q]) float64
    on the CPU; rows with no visible key: out 0, lse +inf."""
    q, k, v = (t.detach().cpu().double() for t in (q, k, v))
    sq, h, _ = q.shape
    sk, hk, _ = k.shape
    k = k.repeat_interleave(h // hk, dim=1)
    v = v.repeat_interleave(h // hk, dim=1)
    s = torch.einsum("ihd,jhd->hij", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    b = bias(sq, sk, slopes)
    if b is not None:
        s = s + b
    mask = visible(sq, sk, causal, window)
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [H, S_q]
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("hij,jhd->ihd", p, v)
    empty = ~mask.any(dim=-1)  # [S_q]
    lse = lse.masked_fill(empty[None, :], float("inf"))
    return out, lse


def heads_first(q, k, v):
    """One sequence's q [S_q, H, D] and k / v [S_k, H_kv, D] as [H, S, D] each, k and v repeated
    over each group of H / H_kv query heads."""
    group = q.shape[1] // k.shape[1]
    return (
        q.transpose(0, 1),
        k.repeat_interleave(group, dim=1).transpose(0, 1),
        v.repeat_interleave(group, dim=1).transpose(0, 1),
    )


def scores(q, k, v, scale, softcap=0.0):
    """One sequence's scores in q's dtype, differentiable: (s [H, S_q, S_k] = scale * q k^T,
    softcapped when softcap > 0, and v as [H, S_k, D]), k and v repeated over each group."""
    qt, kt, vt = heads_first(q, k, v)
    s = (qt @ kt.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    return s, vt


def pytorch_attention(q, k, v, scale, causal=False, window=(-1, -1), softcap=0.0, slopes=None):
    """PyTorch's own attention in q's dtype, one sequence -> out [S_q, H, D] in that dtype:
    scaled_dot_product_attention (boolean mask, or the ALiBi bias as a float mask in the dtype),
    or, with softcap (which SDPA lacks), the formula op by op in the dtype. Rows with no visible
    key are set to 0 (SDPA gives NaN there)."""
    dtype = q.dtype
    sq, h, d = q.shape
    sk = k.shape[0]
    qt, kt, vt = heads_first(q, k, v)  # [H, S, D]
    mask = visible(sq, sk, causal, window).to(q.device)
    b = bias(sq, sk, slopes)
    if softcap:
        s, _ = scores(q, k, v, scale, softcap)
        if b is not None:
            s = s + b.to(device=q.device, dtype=dtype)
        s = s.masked_fill(~mask, float("-inf"))
        out = torch.softmax(s, dim=-1).nan_to_num(0.0) @ vt
    else:
        if b is None:
            attn_mask = mask
        else:
            attn_mask = b.to(device=q.device, dtype=dtype).masked_fill(~mask, float("-inf"))
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=attn_mask, scale=scale)
    out = out.transpose(0, 1).nan_to_num(0.0)
    empty = ~mask.any(dim=-1)
    return out.masked_fill(empty[:, None, None].to(out.device), 0.0)


# ---- checks ----


def check_out(
    ours: torch.Tensor, pytorch: torch.Tensor, ref: torch.Tensor, v: torch.Tensor, what: str
) -> None:
    """The error bound of the module docstring (max over the tensor)."""
    ours, pytorch = ours.detach().cpu().double(), pytorch.detach().cpu().double()
    assert torch.isfinite(ours).all(), f"{what}: non-finite output"
    err = (ours - ref).abs().max().item() if ref.numel() else 0.0
    err_pt = (pytorch - ref).abs().max().item() if ref.numel() else 0.0
    vmax = v.detach().abs().max().item() if v.numel() else 0.0
    bound = 2 * err_pt + FLOOR * vmax
    assert err <= bound, (
        f"{what}: max error {err:.3g} > 2 x PyTorch's {err_pt:.3g} + floor {FLOOR * vmax:.3g}"
    )


def check_lse(lse: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    lse = lse.detach().cpu().double()
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(lse) & (lse > 0), inf), (
        f"{what}: +inf lse exactly on the rows without keys"
    )
    diff = (lse[~inf] - ref[~inf]).abs()
    tol = LSE_TOL * (1 + ref[~inf].abs())
    assert bool((diff <= tol).all()), (
        f"{what}: lse error {diff.max().item() if diff.numel() else 0:.3g}"
    )


# ---- batches made of sequences ----


def lengths(seed: int, batch: int, lo: int, hi: int) -> List[int]:
    return torch.randint(lo, hi + 1, (batch,), generator=gen(seed)).tolist()


def cu_seqlens(lens: Sequence[int], device) -> torch.Tensor:
    return torch.tensor(
        [0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=device
    )


def paged_cache(
    k_seqs: Sequence[torch.Tensor],
    v_seqs: Sequence[torch.Tensor],
    block_size: int,
    seed: int,
    extra_blocks: int = 3,
    max_blocks: Optional[int] = None,
):
    """Scatter per-sequence K/V rows [L_b, H_kv, D] into a paged cache [num_blocks, block_size,
    H_kv, D] (random garbage elsewhere) with a random block table (each sequence's blocks at
    random, distinct places; unused table entries point at random valid blocks)."""
    device, dtype = k_seqs[0].device, k_seqs[0].dtype
    hk, d = k_seqs[0].shape[1:]
    need = [max(1, math.ceil(k.shape[0] / block_size)) for k in k_seqs]
    width = max(need) if max_blocks is None else max_blocks
    num_blocks = sum(need) + extra_blocks
    k_cache = randn((num_blocks, block_size, hk, d), dtype, device, seed=seed + 100, scale=30.0)
    v_cache = randn((num_blocks, block_size, hk, d), dtype, device, seed=seed + 101, scale=30.0)
    perm = torch.randperm(num_blocks, generator=gen(seed)).tolist()
    table = torch.randint(
        0, num_blocks, (len(k_seqs), width), generator=gen(seed + 1), dtype=torch.int32
    )
    at = 0
    for b, (ks, vs) in enumerate(zip(k_seqs, v_seqs)):
        for i in range(need[b]):
            blk = perm[at]
            at += 1
            table[b, i] = blk
            rows = slice(i * block_size, min((i + 1) * block_size, ks.shape[0]))
            n = rows.stop - rows.start
            if n > 0:
                k_cache[blk, :n] = ks[rows]
                v_cache[blk, :n] = vs[rows]
    return k_cache, v_cache, table.to(device)


def sequences_check(
    outs: Sequence[torch.Tensor],
    q_seqs,
    k_seqs,
    v_seqs,
    scale,
    what,
    causal=False,
    window=(-1, -1),
    softcap=0.0,
    slopes: Optional[Sequence[Optional[torch.Tensor]]] = None,
    lses: Optional[Sequence[torch.Tensor]] = None,
) -> None:
    """Checks each sequence's output (and lse) against the reference and PyTorch's error."""
    refs, pts, ours = [], [], []
    for b, (q, k, v) in enumerate(zip(q_seqs, k_seqs, v_seqs)):
        s = None if slopes is None else slopes[b]
        ref, ref_lse = ref_attention(q, k, v, scale, causal, window, softcap, s)
        pt = pytorch_attention(q, k, v, scale, causal, window, softcap, s)
        refs.append(ref)
        pts.append(pt)
        ours.append(outs[b])
        if lses is not None:
            check_lse(lses[b], ref_lse, f"{what} lse of sequence {b}")
    v_all = torch.cat([v.reshape(-1) for v in v_seqs]) if v_seqs else torch.zeros(0)
    check_out(
        torch.cat([o.reshape(-1, *o.shape[-2:]) for o in ours]),
        torch.cat([p.reshape(-1, *p.shape[-2:]) for p in pts]),
        torch.cat([r.reshape(-1, *r.shape[-2:]) for r in refs]),
        v_all,
        what,
    )


# ---- outputs that show unwritten elements ----


def nan_padded(shape, dtype, device):
    """A NaN-filled buffer whose rows are wider than head_dim = shape[-1] (rounded up to a multiple
    of 8, plus 16), and the view of its first head_dim columns: a column written past head_dim
    (or a row left unwritten) shows in the buffer."""
    d = shape[-1]
    width = (d + 7) // 8 * 8 + 16
    buf = torch.full((*shape[:-1], width), float("nan"), dtype=dtype, device=device)
    return buf, buf[..., :d]


def untouched_past(buf, d, what):
    assert bool(buf[..., d:].isnan().all()), f"{what}: columns past head_dim {d} were written"


def batch_check(out, q, k, v, lse, what, **opts):
    """A [B, S, H, D] result, sequence by sequence, at the default scale of q's head dim."""
    sequences_check(
        list(out.unbind(0)),
        q.unbind(0),
        k.unbind(0),
        v.unbind(0),
        q.shape[-1] ** -0.5,
        what,
        lses=list(lse.unbind(0)),
        **opts,
    )


def packed_check(out, q, k, v, lens_q, lens_k, what, lse=None, **opts):
    """A varlen result: out and q [total_q, H, D], k and v [total_k, H_kv, D] packed by lens_q /
    lens_k (lse [H, total_q]), sequence by sequence, at the default scale of q's head dim."""
    sequences_check(
        list(out.split(lens_q)),
        list(q.split(lens_q)),
        list(k.split(lens_k)),
        list(v.split(lens_k)),
        q.shape[-1] ** -0.5,
        what,
        lses=None if lse is None else list(lse.split(lens_q, dim=1)),
        **opts,
    )


# ---- rotary (flash-attn's apply_rotary_emb, float64) ----


def ref_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    interleaved: bool,
):
    """x [S, H, D] rotated at table rows positions [S] -> float64; cos/sin [rows, rot/2]."""
    x = x.detach().cpu().double()
    rot = 2 * cos.shape[1]
    c = cos.detach().cpu().double()[positions.cpu().long()][:, None, :]
    s = sin.detach().cpu().double()[positions.cpu().long()][:, None, :]
    r, rest = x[..., :rot], x[..., rot:]
    if interleaved:
        a, b = r[..., 0::2], r[..., 1::2]
    else:
        a, b = r[..., : rot // 2], r[..., rot // 2 :]
    na, nb = a * c - b * s, b * c + a * s
    r = torch.stack([na, nb], dim=-1).flatten(-2) if interleaved else torch.cat([na, nb], dim=-1)
    return torch.cat([r, rest], dim=-1)


def rotary_tables(rows: int, rot_dim: int, dtype, device, seed=11):
    angle = torch.rand(rows, rot_dim // 2, generator=gen(seed), dtype=torch.float64) * 2 * math.pi
    return angle.cos().to(device=device, dtype=dtype), angle.sin().to(device=device, dtype=dtype)


def expect_raises(match: str):
    """pytest.raises for an error whose message names `match` (C++ checks raise RuntimeError,
    Python-level ones ValueError)."""
    import re

    import pytest

    return pytest.raises((RuntimeError, ValueError), match=rf"(?<![\w.]){re.escape(match)}(?!\w)")
