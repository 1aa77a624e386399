"""Plain-PyTorch references of the rotary embedding of this kernel (private, not in `__all__`).

Reached through the loaded kernel (`kernel._reference`) by the benchmarks (their `verify_*`
workloads) and used by the autograd formulas of `_custom_ops` for the gradients w.r.t. cos and
sin; the semantics are those of kernel_src/rope_params.h.

Two kinds of reference:

* `rope` (and the `rows` / `pairs` / `join_pairs` helpers): the contract's math for every
  option, evaluated in `torch.promote_types(x.dtype, compute_dtype)` without rounding; pass
  `compute_dtype=torch.float64` for an accuracy reference, `torch.float32` for the fp32 result a
  benchmark casts to the output dtype. Differentiable by plain autograd.
* `vllm_rotary_embedding`, `flash_apply_rotary_emb`, `transformers_apply_rotary_pos_emb` and
  `ltx_apply_rotary_emb`: the calling conventions, out of place. The transformers and diffusers
  ones are those libraries' forwards written out with the same torch ops in the same precision
  (eager baselines: transformers rounds q * cos, rotate_half(q) * sin and their sum to the
  activation dtype; the kernel rounds once).
"""

from typing import Optional, Tuple

import torch


def _upcast(t: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
    return t.to(torch.promote_types(t.dtype, compute_dtype))


# ---- the contract ----


def pairs(x: torch.Tensor, rot_dim: int, interleaved: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """The pair halves ``(a, b)`` of the first ``rot_dim`` channels of ``x [..., D]``:
    NeoX ``a_i = x[i], b_i = x[i + rot/2]``; interleaved ``a_i = x[2i], b_i = x[2i + 1]``."""
    if interleaved:
        return x[..., 0:rot_dim:2], x[..., 1:rot_dim:2]
    half = rot_dim // 2
    return x[..., :half], x[..., half:rot_dim]


def join_pairs(a: torch.Tensor, b: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Inverse of `pairs`: the ``rot_dim`` channels holding ``a`` and ``b``."""
    if interleaved:
        return torch.stack([a, b], dim=-1).flatten(-2)
    return torch.cat([a, b], dim=-1)


def rows(
    batch: int,
    seqlen: int,
    device: torch.device,
    positions: Optional[torch.Tensor] = None,
    seqlen_offsets: Optional[torch.Tensor] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    seqlen_offset: int = 0,
) -> torch.Tensor:
    """The table row of every token, ``[batch, seqlen]`` int64 (rope_params.h row modes)."""
    if positions is not None:
        return positions.to(torch.int64).expand(batch, seqlen)
    s = torch.arange(seqlen, device=device, dtype=torch.int64)
    if cu_seqlens is not None:
        cu = cu_seqlens.to(torch.int64)
        seq = torch.searchsorted(cu[1:], s, right=True)  # the sequence of each packed token
        r = s - cu[seq] + seqlen_offset
        if seqlen_offsets is not None:
            r = r + seqlen_offsets.to(torch.int64)[seq]
        return r.unsqueeze(0)
    r = s.unsqueeze(0).expand(batch, seqlen) + seqlen_offset
    if seqlen_offsets is not None:
        r = r + seqlen_offsets.to(torch.int64).unsqueeze(1)
    return r


def token_tables(table: torch.Tensor, token_rows: torch.Tensor, batch: int) -> torch.Tensor:
    """``table [TB, R, TH, W]`` gathered per token: ``[batch, seqlen, TH, W]``."""
    tb = (
        torch.arange(batch, device=table.device).unsqueeze(1)
        if table.shape[0] != 1
        else torch.zeros(1, 1, dtype=torch.int64, device=table.device)
    )
    return table[tb, token_rows]


def _rotate(
    x: torch.Tensor,
    ca: torch.Tensor,
    cb: torch.Tensor,
    sa: torch.Tensor,
    sb: torch.Tensor,
    rot_dim: int,
    interleaved: bool,
    transpose: bool,
) -> torch.Tensor:
    a, b = pairs(x, rot_dim, interleaved)
    if transpose:
        na, nb = a * ca + b * sb, b * cb - a * sa
    else:
        na, nb = a * ca - b * sa, b * cb + a * sb
    rotated = join_pairs(na, nb, interleaved)
    return torch.cat([rotated, x[..., rot_dim:]], dim=-1)


def rope(
    q: torch.Tensor,
    k: Optional[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    rot_dim: int,
    positions: Optional[torch.Tensor] = None,
    seqlen_offsets: Optional[torch.Tensor] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    seqlen_offset: int = 0,
    interleaved: bool = False,
    full_table: bool = False,
    transpose: bool = False,
    compute_dtype: torch.dtype = torch.float32,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The general form (the `rope_out` op): q, k ``[B, S, H, D]``, cos/sin ``[TB, R, TH, W]``.

    Returns the rotated ``(q, k)`` (``k`` None when absent) in the compute dtype, unrounded.
    """
    batch, seqlen = q.shape[0], q.shape[1]
    r = rows(batch, seqlen, q.device, positions, seqlen_offsets, cu_seqlens, seqlen_offset)
    c = _upcast(token_tables(cos, r, batch), compute_dtype)
    s = _upcast(token_tables(sin, r, batch), compute_dtype)
    if full_table:
        ca, cb = pairs(c, rot_dim, interleaved)
        sa, sb = pairs(s, rot_dim, interleaved)
    else:
        ca = cb = c
        sa = sb = s
    outs = []
    for x in (q, k):
        outs.append(
            None
            if x is None
            else _rotate(_upcast(x, compute_dtype), ca, cb, sa, sb, rot_dim, interleaved, transpose)
        )
    return outs[0], outs[1]


# ---- calling conventions, out of place ----


def vllm_rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    compute_dtype: torch.dtype = torch.float32,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """vLLM ``rotary_embedding``, returning new tensors of the input shapes (compute dtype)."""
    rot_dim = cos_sin_cache.shape[-1]
    half = rot_dim // 2
    cache = cos_sin_cache[positions.to(torch.int64)]  # [..., rot_dim]
    cos = _upcast(cache[..., :half], compute_dtype).unsqueeze(-2)
    sin = _upcast(cache[..., half:], compute_dtype).unsqueeze(-2)

    def one(x):
        if x is None:
            return None
        shape = x.shape
        xh = _upcast(x, compute_dtype).reshape(*positions.shape, -1, head_size)
        return _rotate(xh, cos, cos, sin, sin, rot_dim, not is_neox, False).reshape(shape)

    return one(query), one(key)


def flash_apply_rotary_emb(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool = False,
    seqlen_offsets=0,
    cu_seqlens: Optional[torch.Tensor] = None,
    conjugate: bool = False,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """flash-attn ``apply_rotary_emb``: x ``[B, S, H, D]`` (or ``[total, H, D]`` with
    ``cu_seqlens``), cos/sin ``[seqlen_ro, rot/2]``; ``seqlen_offsets`` an int or ``[B]``."""
    varlen = cu_seqlens is not None
    x4 = x.unsqueeze(0) if varlen else x
    offsets = seqlen_offsets if isinstance(seqlen_offsets, torch.Tensor) else None
    offset = 0 if offsets is not None else int(seqlen_offsets)
    out, _ = rope(
        x4,
        None,
        cos[None, :, None, :],
        sin[None, :, None, :],
        rot_dim=2 * cos.shape[-1],
        seqlen_offsets=offsets,
        cu_seqlens=cu_seqlens,
        seqlen_offset=offset,
        interleaved=interleaved,
        transpose=conjugate,
        compute_dtype=compute_dtype,
    )
    return out.squeeze(0) if varlen else out


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """transformers ``rotate_half``."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def transformers_apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
) -> Tuple[torch.Tensor, torch.Tensor]:
    """transformers ``apply_rotary_pos_emb`` (Llama, 5.x), op for op, with the partial-rotary
    split of GPT-NeoX / Phi / GLM when cos has fewer channels than q (leading channels rotated,
    the rest passed through)."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    rot = cos.shape[-1]

    def one(x):
        x_rot, x_pass = x[..., :rot], x[..., rot:]
        y = x_rot * cos + rotate_half(x_rot) * sin
        return torch.cat([y, x_pass], dim=-1) if x_pass.shape[-1] else y

    return one(q), one(k)


def ltx_apply_rotary_emb(x: torch.Tensor, freqs: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """diffusers ``transformer_ltx.apply_rotary_emb``: x ``[B, S, C]``, cos/sin ``[B, S, C]``,
    interleaved pairs, fp32 math, one rounding to x's dtype."""
    cos, sin = freqs
    x_real, x_imag = x.unflatten(2, (-1, 2)).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(2)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)
