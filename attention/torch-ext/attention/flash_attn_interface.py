"""flash-attn 2's ``flash_attn.flash_attn_interface``, forward only: the public functions with
flash-attn 2.8's signatures and return conventions, and the private ``_flash_attn_forward`` /
``_flash_attn_varlen_forward`` (alias ``_wrapped_flash_attn_forward`` / ``_wrapped_...``) that
diffusers' hub backends resolve as ``flash_attn_interface._flash_attn_forward``.

Conventions (flash-attn's):
- q ``[B, S_q, H, D]``, k / v ``[B, S_k, H_kv, D]`` (H a multiple of H_kv); varlen: ``[total, H,
  D]`` rows packed by ``cu_seqlens`` (int32 ``[B + 1]``) with ``max_seqlen`` the longest one.
- ``softmax_scale`` defaults to ``D ** -0.5``; ``causal`` is bottom-right aligned; ``window_size
  = (left, right)``, -1 = unbounded (None accepted as in FA3 / FA4); ``softcap`` 0 = off;
  ``alibi_slopes`` float32 ``[H]`` or ``[B, H]``; ``deterministic`` (default False, as in
  flash-attn) is the backward's: on CUDA False adds dQ into an fp32 workspace in a varying order
  (faster; dQ may differ in its last bits from run to run; on H100 / H200 the Hopper kernel takes
  head dims 40 to 256, with dK and dV of other bits than True's), True computes dQ in a pass of
  its own (the same bits on every run).
  The forward, and the CPU backward, are deterministic either way.
- ``return_attn_probs=True`` returns ``(out, softmax_lse, None)``: the log-sum-exp ``[B, H, S_q]``
  (varlen ``[H, total_q]``) in float32, as flash-attn returns it; the probabilities themselves
  (flash-attn's ``S_dmask``, which needs dropout) are not available (None).
- ``dropout_p > 0`` raises NotImplementedError. A backward through the dense and varlen functions
  runs on the CPU (all of their options) and on CUDA (head dims that are multiples of 8 up to
  128; others raise NotImplementedError); it raises NotImplementedError for
  ``flash_attn_with_kvcache`` and the paged varlen form everywhere (the forward works with
  gradients enabled, so ``torch.no_grad`` is not required for inference).
- Beyond flash-attn: the public functions take ``enable_pdl: Optional[bool] = None``
  (programmatic dependent launch on CUDA sm_90+; None: the kernels' default, on; False: off;
  ignored on CPU), and FA3's ``s_aux: Optional[Tensor] = None``: attention sinks, one logit per
  query head ``[H]`` (gpt-oss's ``sinks``) that joins every row's softmax with no value, so the
  row's weights sum to less than 1. It is differentiable (dq, dk, dv and d s_aux) wherever the
  backward runs, and ``softmax_lse`` includes it. The kernels compute attention without it and a
  float32 pass rescales out by Z / (Z + exp(s_aux)) (Z = exp(lse)): one more read and write of
  out.
"""

from typing import Optional, Tuple, Union

import torch

from . import _custom_ops
from ._ops import ops

__all__ = [
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
]


def _result(out: torch.Tensor, lse: torch.Tensor, return_attn_probs: bool):
    return (out, lse, None) if return_attn_probs else out


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    enable_pdl: Optional[bool] = None,
    s_aux: Optional[torch.Tensor] = None,
):
    """flash-attn ``flash_attn_func``: q ``[B, S_q, H, D]``, k / v ``[B, S_k, H_kv, D]`` ->
    out ``[B, S_q, H, D]`` (or ``(out, softmax_lse, None)``)."""
    out, lse = _custom_ops.attention(
        "flash_attn_func",
        q,
        k,
        v,
        alibi_slopes=alibi_slopes,
        softmax_scale=softmax_scale,
        softcap=softcap,
        causal=causal,
        window_size=window_size,
        dropout_p=dropout_p,
        enable_pdl=enable_pdl,
        deterministic=deterministic,
        s_aux=s_aux,
    )
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: Optional[torch.Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    enable_pdl: Optional[bool] = None,
    block_table: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    s_aux: Optional[torch.Tensor] = None,
):
    """flash-attn ``flash_attn_varlen_func``: packed q ``[total_q, H, D]`` and k / v ``[total_k,
    H_kv, D]`` delimited by ``cu_seqlens_q`` / ``cu_seqlens_k`` (int32 ``[B + 1]``).

    Paged K/V (flash-attn's ``block_table``, vLLM's layout): k / v are caches ``[num_blocks,
    block_size, H_kv, D]``, ``block_table`` (int32 ``[B, max_blocks]``) lists each sequence's
    blocks, and the key lengths are ``seqused_k`` (int32 ``[B]``) if given, else the differences
    of ``cu_seqlens_k`` (which may then be None). ``seqused_k`` also limits the keys of packed
    (unpaged) sequences: sequence b uses its first ``seqused_k[b]`` keys."""
    op = "flash_attn_varlen_func"
    if block_table is None and cu_seqlens_k is None:
        raise ValueError(f"{op}: cu_seqlens_k is required without block_table")
    if block_table is not None and cu_seqlens_k is None and seqused_k is None:
        raise ValueError(
            f"{op}: with block_table, pass seqused_k or cu_seqlens_k (the key lengths)"
        )
    out, lse = _custom_ops.attention(
        op,
        q,
        k,
        v,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        seqused_k=seqused_k,
        block_table=block_table,
        alibi_slopes=alibi_slopes,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        softmax_scale=softmax_scale,
        softcap=softcap,
        causal=causal,
        window_size=window_size,
        dropout_p=dropout_p,
        enable_pdl=enable_pdl,
        deterministic=deterministic,
        s_aux=s_aux,
    )
    return _result(out, lse, return_attn_probs)


def _unbind_packed(op: str, name: str, x: torch.Tensor, dim: int, parts: int):
    if x.dim() <= dim or x.shape[dim] != parts:
        layout = {
            (2, 3): "[B, S, 3, H, D]",
            (2, 2): "[B, S, 2, H_kv, D]",
            (1, 3): "[total, 3, H, D]",
            (1, 2): "[total_k, 2, H_kv, D]",
        }[(dim, parts)]
        raise ValueError(f"{op}: {name} must have shape {layout}, got {list(x.shape)}")
    return x.unbind(dim)


def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    enable_pdl: Optional[bool] = None,
    s_aux: Optional[torch.Tensor] = None,
):
    """flash-attn ``flash_attn_qkvpacked_func``: qkv ``[B, S, 3, H, D]`` (views, no copy)."""
    op = "flash_attn_qkvpacked_func"
    q, k, v = _unbind_packed(op, "qkv", qkv, 2, 3)
    out, lse = _custom_ops.attention(
        op,
        q,
        k,
        v,
        alibi_slopes=alibi_slopes,
        softmax_scale=softmax_scale,
        softcap=softcap,
        causal=causal,
        window_size=window_size,
        dropout_p=dropout_p,
        enable_pdl=enable_pdl,
        deterministic=deterministic,
        s_aux=s_aux,
    )
    return _result(out, lse, return_attn_probs)


def flash_attn_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    enable_pdl: Optional[bool] = None,
    s_aux: Optional[torch.Tensor] = None,
):
    """flash-attn ``flash_attn_kvpacked_func``: q ``[B, S_q, H, D]``, kv ``[B, S_k, 2, H_kv, D]``."""
    op = "flash_attn_kvpacked_func"
    k, v = _unbind_packed(op, "kv", kv, 2, 2)
    out, lse = _custom_ops.attention(
        op,
        q,
        k,
        v,
        alibi_slopes=alibi_slopes,
        softmax_scale=softmax_scale,
        softcap=softcap,
        causal=causal,
        window_size=window_size,
        dropout_p=dropout_p,
        enable_pdl=enable_pdl,
        deterministic=deterministic,
        s_aux=s_aux,
    )
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    enable_pdl: Optional[bool] = None,
    s_aux: Optional[torch.Tensor] = None,
):
    """flash-attn ``flash_attn_varlen_qkvpacked_func``: qkv ``[total, 3, H, D]``."""
    op = "flash_attn_varlen_qkvpacked_func"
    q, k, v = _unbind_packed(op, "qkv", qkv, 1, 3)
    out, lse = _custom_ops.attention(
        op,
        q,
        k,
        v,
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_k=cu_seqlens,
        alibi_slopes=alibi_slopes,
        max_seqlen_q=max_seqlen,
        max_seqlen_k=max_seqlen,
        softmax_scale=softmax_scale,
        softcap=softcap,
        causal=causal,
        window_size=window_size,
        dropout_p=dropout_p,
        enable_pdl=enable_pdl,
        deterministic=deterministic,
        s_aux=s_aux,
    )
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    enable_pdl: Optional[bool] = None,
    s_aux: Optional[torch.Tensor] = None,
):
    """flash-attn ``flash_attn_varlen_kvpacked_func``: q ``[total_q, H, D]``, kv ``[total_k, 2,
    H_kv, D]``."""
    op = "flash_attn_varlen_kvpacked_func"
    k, v = _unbind_packed(op, "kv", kv, 1, 2)
    out, lse = _custom_ops.attention(
        op,
        q,
        k,
        v,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        alibi_slopes=alibi_slopes,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        softmax_scale=softmax_scale,
        softcap=softcap,
        causal=causal,
        window_size=window_size,
        dropout_p=dropout_p,
        enable_pdl=enable_pdl,
        deterministic=deterministic,
        s_aux=s_aux,
    )
    return _result(out, lse, return_attn_probs)


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: Optional[torch.Tensor] = None,
    v: Optional[torch.Tensor] = None,
    rotary_cos: Optional[torch.Tensor] = None,
    rotary_sin: Optional[torch.Tensor] = None,
    cache_seqlens: Optional[Union[int, torch.Tensor]] = None,
    cache_batch_idx: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    block_table: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Optional[torch.Tensor] = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    enable_pdl: Optional[bool] = None,
    s_aux: Optional[torch.Tensor] = None,
):
    """flash-attn ``flash_attn_with_kvcache`` (inference: not differentiable).

    q ``[B, S_q, H, D]``; ``k_cache`` / ``v_cache`` ``[B_cache, S_cache, H_kv, D]``, or paged
    ``[num_blocks, block_size, H_kv, D]`` with ``block_table`` (int32 ``[B, max_blocks]``).
    New ``k`` / ``v`` ``[B, S_new, H_kv, D]`` are written into the caches **in place** at rows
    ``cache_seqlens[b] .. + S_new`` (``cache_seqlens``: int or int32 ``[B]``, required with k/v),
    then q attends to keys ``[cache_leftpad[b], cache_seqlens[b] + S_new)`` of its cache
    (``cache_batch_idx`` selects the cache of each sequence). With ``rotary_cos`` /
    ``rotary_sin`` ``[seqlen_ro, rotary_dim / 2]`` the new keys are rotated at positions
    ``cache_seqlens + i`` before they are stored, and q at ``cache_seqlens + i`` (causal or local
    attention) or ``cache_seqlens`` (otherwise); ``rotary_interleaved``: GPT-J pairs, else NeoX.
    ``num_splits``: split-KV count (0: the kernel's choice; the CPU ignores it). Returns out
    ``[B, S_q, H, D]``, or ``(out, softmax_lse [B, H, S_q])``.

    ``cache_seqlens[b] + S_new`` must fit the cache: ``S_cache`` rows, or ``max_blocks x
    block_size`` with ``block_table``. On the CPU a call past that raises before writing
    anything. On CUDA the values are not read on the host (no synchronization): the kernels
    write and read nothing past the cache, that sequence's output is NaN, and the RuntimeError
    (naming ``block_table`` or ``cache_seqlens``) comes from the next call on the device, or
    from ``check_kvcache_errors()``."""
    if cache_seqlens is not None and not isinstance(cache_seqlens, torch.Tensor):
        cache_seqlens = torch.full(
            (q.shape[0],), int(cache_seqlens), dtype=torch.int32, device=k_cache.device
        )
    left, right = _custom_ops.window("flash_attn_with_kvcache", window_size)
    scale = _custom_ops.softmax_scale_of(q, softmax_scale)
    _custom_ops.check_sinks("flash_attn_with_kvcache", s_aux, q)
    out, lse = ops.fwd_kvcache(
        q,
        k_cache,
        v_cache,
        k,
        v,
        cache_seqlens,
        rotary_cos,
        rotary_sin,
        cache_batch_idx,
        cache_leftpad,
        block_table,
        alibi_slopes,
        None,
        scale,
        bool(causal),
        left,
        right,
        float(softcap or 0.0),
        bool(rotary_interleaved),
        int(num_splits),
        enable_pdl,
    )
    if s_aux is not None:
        out, lse = _custom_ops.with_sinks(out, lse, s_aux)
    return (out, lse) if return_softmax_lse else out


# ---- flash-attn's private entry points (diffusers' hub backends) ----


def _flash_attn_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int = -1,
    window_size_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    return_softmax: bool = False,
):
    """flash-attn ``_flash_attn_forward`` -> ``(out, softmax_lse [B, H, S_q], S_dmask, rng_state)``;
    S_dmask and rng_state are None (no dropout)."""
    if return_softmax:
        raise NotImplementedError(
            "_flash_attn_forward: return_softmax (the attention probabilities) is not implemented"
        )
    out, lse = _custom_ops.attention(
        "_flash_attn_forward",
        q,
        k,
        v,
        alibi_slopes=alibi_slopes,
        softmax_scale=softmax_scale,
        softcap=softcap,
        causal=causal,
        window_size=(window_size_left, window_size_right),
        dropout_p=dropout_p,
    )
    return out, lse, None, None


def _flash_attn_varlen_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int = -1,
    window_size_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    return_softmax: bool = False,
    block_table: Optional[torch.Tensor] = None,
    leftpad_k: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    zero_tensors: bool = False,
    num_splits: int = 0,
):
    """flash-attn ``_flash_attn_varlen_forward`` -> ``(out, softmax_lse [H, total_q], S_dmask,
    rng_state)``; S_dmask and rng_state are None (no dropout).

    The parameter list is flash-attn 2.8.4's, ``num_splits`` (its last parameter, added there)
    included: the split-KV count, 0 the kernel's choice, >= 0 (the CPU ignores it);
    ``zero_tensors`` (an older flash-attn parameter) is accepted and has no effect."""
    op = "_flash_attn_varlen_forward"
    if return_softmax:
        raise NotImplementedError(
            f"{op}: return_softmax (the attention probabilities) is not implemented"
        )
    if leftpad_k is not None:
        raise NotImplementedError(f"{op}: leftpad_k is not supported with packed sequences")
    out, lse = _custom_ops.attention(
        op,
        q,
        k,
        v,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        seqused_k=seqused_k,
        block_table=block_table,
        alibi_slopes=alibi_slopes,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        softmax_scale=softmax_scale,
        softcap=softcap,
        causal=causal,
        window_size=(window_size_left, window_size_right),
        num_splits=num_splits,
        dropout_p=dropout_p,
    )
    return out, lse, None, None


def _flash_attn_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    dq: Optional[torch.Tensor],
    dk: Optional[torch.Tensor],
    dv: Optional[torch.Tensor],
    dropout_p: float,
    softmax_scale: Optional[float],
    causal: bool,
    window_size_left: int = -1,
    window_size_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    rng_state: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """flash-attn ``_flash_attn_backward``: writes the gradients of q, k and v into ``dq``, ``dk``
    and ``dv`` (new tensors where None) and returns ``softmax_d`` = rowsum(dout * out), float32
    [B, H, S_q] (flash-attn pads S_q on CUDA; this does not). ``dropout_p > 0`` raises
    NotImplementedError, and so does a CUDA head dim past 256 (past 128 on GPUs with 99 KB of
    shared memory a block: sm_86, sm_89, sm_120).
    ``deterministic``: on CUDA False adds dQ into an fp32 workspace in a varying order (dq may
    differ in its last bits from run to run; on H100 / H200 the Hopper kernel takes head dims 64
    and 128), True runs a dQ pass of its own (the same bits on every run); the CPU backward is
    deterministic regardless."""
    left, right = _custom_ops.window("_flash_attn_backward", (window_size_left, window_size_right))
    return ops.bwd(
        *(x.contiguous() for x in (dout, q, k, v, out)),
        softmax_lse,
        dq,
        dk,
        dv,
        alibi_slopes,
        float(dropout_p or 0.0),
        _custom_ops.softmax_scale_of(q, softmax_scale),
        bool(causal),
        left,
        right,
        float(softcap or 0.0),
        bool(deterministic),
        None,
        rng_state,
    )[3]


def _flash_attn_varlen_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    dq: Optional[torch.Tensor],
    dk: Optional[torch.Tensor],
    dv: Optional[torch.Tensor],
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
    softmax_scale: Optional[float],
    causal: bool,
    window_size_left: int = -1,
    window_size_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    rng_state: Optional[torch.Tensor] = None,
    zero_tensors: bool = False,
) -> torch.Tensor:
    """flash-attn ``_flash_attn_varlen_backward`` (2.8's parameters): as
    ``_flash_attn_backward`` for packed sequences; ``softmax_d`` is float32 [H, total_q]. Rows
    outside every sequence get zero gradients whether or not ``zero_tensors``."""
    op = "_flash_attn_varlen_backward"
    left, right = _custom_ops.window(op, (window_size_left, window_size_right))
    return ops.varlen_bwd(
        *(x.contiguous() for x in (dout, q, k, v, out)),
        softmax_lse,
        dq,
        dk,
        dv,
        cu_seqlens_q,
        cu_seqlens_k,
        alibi_slopes,
        _custom_ops.as_int(max_seqlen_q),
        _custom_ops.as_int(max_seqlen_k),
        float(dropout_p or 0.0),
        _custom_ops.softmax_scale_of(q, softmax_scale),
        bool(zero_tensors),
        bool(causal),
        left,
        right,
        float(softcap or 0.0),
        bool(deterministic),
        None,
        rng_state,
    )[3]


# flash-attn >= 2.6 names its torch.library-wrapped forward / backward `_wrapped_*` (diffusers'
# local flash backend imports those names).
_wrapped_flash_attn_forward = _flash_attn_forward
_wrapped_flash_attn_varlen_forward = _flash_attn_varlen_forward
_wrapped_flash_attn_backward = _flash_attn_backward
_wrapped_flash_attn_varlen_backward = _flash_attn_varlen_backward
