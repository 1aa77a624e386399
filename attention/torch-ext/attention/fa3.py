"""FlashAttention-3's Python API (FA3's ``flash_attn_interface``, as ``kernels-community/flash-attn3``
and ``vllm-flash-attn3`` export it) on this package's kernels, for callers written against FA3:
diffusers' ``_flash_3_hub`` / ``_flash_3_varlen_hub`` backends (``use_with_diffusers``) and code
that imports ``flash_attn_interface.flash_attn_func``.

What differs from the flash-attn 2 functions of this package (``flash_attn_interface``):
- FA3's parameter order (``softmax_scale`` fourth, no ``dropout_p`` or ``alibi_slopes``) and
  return convention: ``out``, or ``(out, softmax_lse)`` with ``return_attn_probs=True``;
- ``num_splits``, ``pack_gqa`` and ``sm_margin`` are FA3's scheduling hints: accepted, and the
  kernels choose for themselves (``flash_attn_with_kvcache`` passes ``num_splits`` on as the
  split-KV count, as the flash-attn 2 one takes it);
- ``s_aux`` (attention sinks, vllm-flash-attn3's) as in the flash-attn 2 functions;
- not available, each a NotImplementedError naming it: ``qv``, ``q_descale`` / ``k_descale`` /
  ``v_descale`` (FA3's fp8 forward), ``attention_chunk``, ``seqused_q``.
``flash_attn_qkvpacked_func`` and ``flash_attn_with_kvcache`` (``page_table`` for flash-attn 2's
``block_table``) complete FA3's public functions but ``flash_attn_combine`` and
``get_scheduler_metadata``, which serve its own split scheduling.
The private ``_flash_attn_forward`` / ``_flash_attn_backward`` take FA3's argument lists (what
diffusers' context-parallel ops call); ``flash_attn_interface`` names this module, so the
attribute paths of FA3's kernel (``flash_attn_interface._flash_attn_forward``) resolve here too.
"""

import sys
from typing import Optional, Tuple

import torch

from . import flash_attn_interface as _fa2

__all__ = [
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_with_kvcache",
]

# FA3's kernel package exposes these functions at its top level and in its flash_attn_interface
# submodule; here both are this module.
flash_attn_interface = sys.modules[__name__]


def _given(value) -> bool:
    """Whether an optional FA3 argument asks for something: not None, False or 0."""
    if value is None or value is False:
        return False
    return value != 0 if isinstance(value, (int, float)) else True


def _unsupported(op: str, **given) -> None:
    """NotImplementedError naming the first FA3 argument this package cannot honour."""
    for name, value in given.items():
        if _given(value):
            raise NotImplementedError(
                f"{op}: {name} is not supported (FlashAttention-3's "
                f"{'fp8 forward' if name.endswith('_descale') else name} is not implemented here)"
            )


def _fp8_and_chunks(q_descale, k_descale, v_descale, attention_chunk) -> dict:
    """The FA3 arguments no entry point here honours (the fp8 forward's descales, chunked
    attention), for _unsupported."""
    return {
        "q_descale": q_descale,
        "k_descale": k_descale,
        "v_descale": v_descale,
        "attention_chunk": attention_chunk,
    }


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    qv: Optional[torch.Tensor] = None,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    window_size: Tuple[Optional[int], Optional[int]] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: Optional[bool] = None,
    deterministic: bool = False,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
    s_aux: Optional[torch.Tensor] = None,
):
    """FA3 ``flash_attn_func``: q ``[B, S_q, H, D]``, k / v ``[B, S_k, H_kv, D]`` -> out ``[B,
    S_q, H, D]``, or ``(out, softmax_lse [B, H, S_q])`` with ``return_attn_probs``."""
    _unsupported(
        "flash_attn_func",
        qv=qv,
        **_fp8_and_chunks(q_descale, k_descale, v_descale, attention_chunk),
    )
    out, lse, _ = _fa2.flash_attn_func(
        q,
        k,
        v,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        softcap=softcap,
        deterministic=deterministic,
        return_attn_probs=True,
        s_aux=s_aux,
    )
    return (out, lse) if return_attn_probs else out


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    seqused_q: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    qv: Optional[torch.Tensor] = None,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    window_size: Tuple[Optional[int], Optional[int]] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: Optional[bool] = None,
    deterministic: bool = False,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
    s_aux: Optional[torch.Tensor] = None,
):
    """FA3 ``flash_attn_varlen_func``: packed q ``[total_q, H, D]`` and k / v ``[total_k, H_kv,
    D]`` delimited by ``cu_seqlens_q`` / ``cu_seqlens_k`` (int32 ``[B + 1]``); ``seqused_k``
    (int32 ``[B]``) keeps the first keys of each sequence. Returns out, or ``(out, softmax_lse
    [H, total_q])`` with ``return_attn_probs``."""
    _unsupported(
        "flash_attn_varlen_func",
        seqused_q=seqused_q,
        qv=qv,
        **_fp8_and_chunks(q_descale, k_descale, v_descale, attention_chunk),
    )
    out, lse, _ = _fa2.flash_attn_varlen_func(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        softcap=softcap,
        deterministic=deterministic,
        return_attn_probs=True,
        seqused_k=seqused_k,
        s_aux=s_aux,
    )
    return (out, lse) if return_attn_probs else out


def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    window_size: Tuple[Optional[int], Optional[int]] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    deterministic: bool = False,
    num_heads_q: Optional[int] = None,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
):
    """FA3 ``flash_attn_qkvpacked_func``: qkv ``[B, S, 3, H, D]``, or with ``num_heads_q`` ``[B,
    S, H + 2 H_kv, D]`` (the query heads, then the key heads, then the value heads; GQA). Views,
    no copy. Returns out, or ``(out, softmax_lse)`` with ``return_attn_probs``."""
    op = "flash_attn_qkvpacked_func"
    _unsupported(
        op,
        **_fp8_and_chunks(q_descale, k_descale, v_descale, attention_chunk),
    )
    if num_heads_q is None:
        if qkv.dim() != 5 or qkv.shape[2] != 3:
            raise ValueError(f"{op}: qkv must be [B, S, 3, H, D], got {list(qkv.shape)}")
        q, k, v = qkv.unbind(2)
    else:
        heads_kv = (qkv.shape[2] - num_heads_q) // 2 if qkv.dim() == 4 else -1
        if heads_kv <= 0 or num_heads_q + 2 * heads_kv != qkv.shape[2]:
            raise ValueError(
                f"{op}: with num_heads_q={num_heads_q}, qkv must be [B, S, num_heads_q + 2 H_kv, "
                f"D], got {list(qkv.shape)}"
            )
        q, k, v = qkv.split([num_heads_q, heads_kv, heads_kv], dim=2)
    return flash_attn_func(
        q,
        k,
        v,
        softmax_scale,
        causal,
        window_size=window_size,
        softcap=softcap,
        deterministic=deterministic,
        return_attn_probs=return_attn_probs,
    )


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: Optional[torch.Tensor] = None,
    v: Optional[torch.Tensor] = None,
    qv: Optional[torch.Tensor] = None,
    rotary_cos: Optional[torch.Tensor] = None,
    rotary_sin: Optional[torch.Tensor] = None,
    cache_seqlens=None,
    cache_batch_idx: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    page_table: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k_new: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    rotary_seqlens: Optional[torch.Tensor] = None,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[Optional[int], Optional[int]] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    scheduler_metadata: Optional[torch.Tensor] = None,
    num_splits: int = 0,
    pack_gqa: Optional[bool] = None,
    sm_margin: int = 0,
    return_softmax_lse: bool = False,
    s_aux: Optional[torch.Tensor] = None,
):
    """FA3 ``flash_attn_with_kvcache`` (inference): the flash-attn 2 function of this package
    (``flash_attn_interface.flash_attn_with_kvcache``: appends ``k`` / ``v`` into the caches in
    place, rotary, ``cache_batch_idx``, ``cache_leftpad``, paged caches) under FA3's names:
    ``page_table`` is flash-attn 2's ``block_table``, ``num_splits`` the split-KV count (0: the
    kernel's choice). Returns out, or ``(out, softmax_lse)`` with ``return_softmax_lse``. Packed
    queries (``cu_seqlens_q``, ``cu_seqlens_k_new``, ``max_seqlen_q``) and ``rotary_seqlens`` are
    not supported."""
    _unsupported(
        "flash_attn_with_kvcache",
        qv=qv,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k_new=cu_seqlens_k_new,
        max_seqlen_q=max_seqlen_q,
        rotary_seqlens=rotary_seqlens,
        **_fp8_and_chunks(q_descale, k_descale, v_descale, attention_chunk),
        scheduler_metadata=scheduler_metadata,
    )
    return _fa2.flash_attn_with_kvcache(
        q,
        k_cache,
        v_cache,
        k,
        v,
        rotary_cos=rotary_cos,
        rotary_sin=rotary_sin,
        cache_seqlens=cache_seqlens,
        cache_batch_idx=cache_batch_idx,
        cache_leftpad=cache_leftpad,
        block_table=page_table,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        softcap=softcap,
        rotary_interleaved=rotary_interleaved,
        num_splits=num_splits,
        return_softmax_lse=return_softmax_lse,
        s_aux=s_aux,
    )


def _flash_attn_forward(
    q,
    k,
    v,
    k_new,
    v_new,
    qv,
    out,
    cu_seqlens_q,
    cu_seqlens_k,
    cu_seqlens_k_new,
    seqused_q,
    seqused_k,
    max_seqlen_q,
    max_seqlen_k,
    page_table,
    kv_batch_idx,
    leftpad_k,
    rotary_cos,
    rotary_sin,
    seqlens_rotary,
    q_descale,
    k_descale,
    v_descale,
    softmax_scale,
    causal,
    window_size_left=-1,
    window_size_right=-1,
    attention_chunk=0,
    softcap=0.0,
    rotary_interleaved=True,
    scheduler_metadata=None,
    num_splits=1,
    pack_gqa=None,
    sm_margin=0,
):
    """FA3 ``_flash_attn_forward`` (its argument list) -> ``(out, softmax_lse, None, None)``:
    dense, or packed with ``cu_seqlens_q`` / ``cu_seqlens_k``; ``out``, if given, receives the
    result. The KV-cache arguments (``k_new``, ``page_table``, rotary, ...) belong to
    ``flash_attn_interface.flash_attn_with_kvcache`` of the flash-attn 2 API."""
    op = "_flash_attn_forward"
    _unsupported(
        op,
        k_new=k_new,
        v_new=v_new,
        qv=qv,
        cu_seqlens_k_new=cu_seqlens_k_new,
        seqused_q=seqused_q,
        page_table=page_table,
        kv_batch_idx=kv_batch_idx,
        leftpad_k=leftpad_k,
        rotary_cos=rotary_cos,
        rotary_sin=rotary_sin,
        seqlens_rotary=seqlens_rotary,
        **_fp8_and_chunks(q_descale, k_descale, v_descale, attention_chunk),
        scheduler_metadata=scheduler_metadata,
    )
    if cu_seqlens_q is None:
        # the flash-attn 2 dense forward has no key lengths: a dense seqused_k must not be dropped
        _unsupported(f"{op} without cu_seqlens_q", seqused_k=seqused_k)
        forward, packed, lengths = _fa2._flash_attn_forward, (), {}
    else:
        forward = _fa2._flash_attn_varlen_forward
        packed = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        lengths = {"seqused_k": seqused_k}
    result, lse, _, _ = forward(
        q,
        k,
        v,
        *packed,
        0.0,
        softmax_scale,
        causal,
        window_size_left,
        window_size_right,
        softcap,
        **lengths,
    )
    if out is not None:
        out.copy_(result)
        result = out
    return result, lse, None, None


def _flash_attn_backward(
    dout,
    q,
    k,
    v,
    out,
    softmax_lse,
    cu_seqlens_q,
    cu_seqlens_k,
    seqused_q,
    seqused_k,
    max_seqlen_q,
    max_seqlen_k,
    dq,
    dk,
    dv,
    softmax_scale,
    causal,
    window_size_left=-1,
    window_size_right=-1,
    softcap=0.0,
    deterministic=False,
    sm_margin=0,
):
    """FA3 ``_flash_attn_backward`` (its argument list): writes the gradients of q, k and v into
    ``dq``, ``dk`` and ``dv`` (new tensors where None) and returns ``(dq, dk, dv, softmax_d)``,
    softmax_d = rowsum(dout * out) in float32 (``[B, H, S_q]``, packed ``[H, total_q]``)."""
    op = "_flash_attn_backward"
    _unsupported(op, seqused_q=seqused_q, seqused_k=seqused_k)
    dq, dk, dv = (torch.empty_like(x) if g is None else g for g, x in ((dq, q), (dk, k), (dv, v)))
    if cu_seqlens_q is None:
        backward, packed = _fa2._flash_attn_backward, ()
    else:
        backward = _fa2._flash_attn_varlen_backward
        packed = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    softmax_d = backward(
        dout,
        q,
        k,
        v,
        out,
        softmax_lse,
        dq,
        dk,
        dv,
        *packed,
        0.0,
        softmax_scale,
        causal,
        window_size_left,
        window_size_right,
        softcap,
        None,
        deterministic,
    )
    return dq, dk, dv, softmax_d
