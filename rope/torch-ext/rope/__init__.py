"""Rotary position embedding (RoPE) kernels: one kernel behind the calling conventions of vLLM,
sgl-kernel / flashinfer, flash-attn, kernels-community `rotary`, transformers and LTX-Video.

Math (kernel_src/rope_params.h): the first ``rot_dim`` channels of each head are rotated in
pairs ``(a_i, b_i)`` — NeoX / half split ``(x[i], x[i + rot/2])`` or GPT-J / interleaved
``(x[2i], x[2i + 1])`` — as ``a' = a cos - b sin``, ``b' = b cos + a sin``, in fp32 with one
rounding to the output dtype; channels ``[rot_dim, head_dim)`` pass through. The backward (and
flash-attn's ``conjugate``) is the transpose, the rotation by ``-theta``.

* vLLM (in place, **not differentiable**): ``rotary_embedding(positions, query, key, head_size,
  cos_sin_cache, is_neox)`` and ``batched_rotary_embedding(..., rot_dim,
  cos_sin_cache_offsets)``; ``cos_sin_cache`` is ``[max_position, rot_dim] = cat(cos, sin)``.
* sgl-kernel / flashinfer (in place): ``apply_rope_with_cos_sin_cache_inplace``.
* flash-attn (differentiable, also with ``inplace=True``): ``apply_rotary_emb``,
  ``apply_rotary_emb_qkv_``, ``apply_rotary_emb_kv_``.
* kernels-community ``rotary`` (out-param): ``apply_rotary(x1, x2, cos, sin, out1, out2, conj)``.
* transformers (differentiable, new tensors): ``apply_rotary_transformers(q, k, cos, sin,
  unsqueeze_dim=1)`` and the alias ``apply_rotary_pos_emb`` (``position_ids`` accepted and
  unused); the layer ``layers.apply_rotary_transformers`` serves ``kernelize`` for transformers'
  ``rotary_pos_emb`` name.
* diffusers LTX-Video (differentiable): ``apply_rotary_emb_ltx(x, (cos, sin))``.

dtypes: float32, float16, bfloat16 activations; tables float32 or the activation dtype (other
table dtypes are converted to float32 by the Python functions). Gradients flow to the
activations through the kernel (its transpose) and to cos / sin, when they require grad,
through a plain PyTorch formula. Double backward is not supported. The in-place and out-param
forms (vLLM, sgl, ``apply_rotary``) are not seen by autograd.

Every function takes ``enable_pdl: Optional[bool] = None``: programmatic dependent launch on CUDA
(sm_90+). None keeps each launch's measured default (the first launch of a call plain, the
launches of later token chunks with PDL), True turns it on for every launch (for a call that
follows a kernel that releases its dependents, as every kernel of this repository does), False
off. Ignored on CPU.
"""

from typing import Optional, Tuple, Union

import torch

from . import _custom_ops, _reference, layers
from ._ops import add_op_namespace_prefix, ops

__all__ = [
    # vLLM
    "rotary_embedding",
    "batched_rotary_embedding",
    # sgl-kernel / flashinfer
    "apply_rope_with_cos_sin_cache_inplace",
    # flash-attn
    "apply_rotary_emb",
    "apply_rotary_emb_qkv_",
    "apply_rotary_emb_kv_",
    # kernels-community rotary / transformers
    "apply_rotary",
    "apply_rotary_transformers",
    "apply_rotary_pos_emb",
    # diffusers LTX-Video
    "apply_rotary_emb_ltx",
    "layers",
]


# ---- vLLM and sgl-kernel / flashinfer: in place, not differentiable ----


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    enable_pdl: Optional[bool] = None,
) -> None:
    """vLLM ``rotary_embedding``: rotates ``query`` (and ``key``) in place.

    ``positions`` ``[T]`` or ``[B, S]`` (int64 or int32) gives each token's row of
    ``cos_sin_cache [max_position, rot_dim] = cat(cos, sin)`` (float32 or the query dtype;
    ``rot_dim`` even, ``<= head_size``). ``query`` ``[T, Hq * head_size]`` / ``[T, Hq,
    head_size]`` (or with ``[B, S]`` leading dimensions), ``key`` likewise with its own head
    count, or None; both may be head-strided views of a fused qkv tensor (unit stride along the
    last dimension). ``is_neox``: half-split pairs, else interleaved (GPT-J). Channels beyond
    ``rot_dim`` are left untouched. A position outside ``[0, max_position)`` raises (CPU) or
    trips a device-side assertion (CUDA).
    """
    ops.rotary_embedding(
        positions, query, key, int(head_size), cos_sin_cache, bool(is_neox), enable_pdl
    )


def batched_rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    rot_dim: int,
    cos_sin_cache_offsets: torch.Tensor,
    enable_pdl: Optional[bool] = None,
) -> None:
    """vLLM ``batched_rotary_embedding`` (multi-LoRA long context): as ``rotary_embedding`` with
    the row ``positions + cos_sin_cache_offsets`` (one offset per token, int64 or int32);
    ``cos_sin_cache`` must have ``rot_dim`` columns."""
    ops.batched_rotary_embedding(
        positions,
        query,
        key,
        int(head_size),
        cos_sin_cache,
        bool(is_neox),
        int(rot_dim),
        cos_sin_cache_offsets,
        enable_pdl,
    )


def apply_rope_with_cos_sin_cache_inplace(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
    fused_set_kv_buffer_arg=None,
    enable_pdl: Optional[bool] = None,
) -> None:
    """sgl-kernel / flashinfer ``apply_rope_with_cos_sin_cache_inplace``: ``rotary_embedding``
    with sgl's argument order and default (``is_neox=True``). query ``[T, Hq * head_size]``,
    key ``[T, Hk * head_size]``; ``cos_sin_cache`` may be float32 (sgl's requirement) or the
    query dtype. ``enable_pdl`` as everywhere (see the module docstring); sgl's
    ``fused_set_kv_buffer_arg`` (a fused KV-cache write) is not supported."""
    if fused_set_kv_buffer_arg is not None:
        raise ValueError(
            "apply_rope_with_cos_sin_cache_inplace: fused_set_kv_buffer_arg is not supported; "
            "write the KV cache after the call"
        )
    ops.rotary_embedding(
        positions, query, key, int(head_size), cos_sin_cache, bool(is_neox), enable_pdl
    )


# ---- flash-attn ----


def _check_activation(op: str, name: str, t: torch.Tensor) -> None:
    if t.dtype not in _custom_ops.KERNEL_DTYPES:
        raise ValueError(
            f"{op}: {name} must be float32, float16 or bfloat16, got {_custom_ops._dtype_name(t.dtype)}"
        )


def _fa_tables(
    op: str,
    cos: torch.Tensor,
    sin: torch.Tensor,
    dtype: torch.dtype,
    head_dim: int,
    names=("cos", "sin"),
):
    """flash-attn cos/sin ``[seqlen_ro, rotary_dim / 2]`` as ``[1, seqlen_ro, 1, rot/2]`` tables."""
    if cos.dim() != 2 or tuple(sin.shape) != tuple(cos.shape):
        raise ValueError(
            f"{op}: {names[0]} and {names[1]} must have one shape [seqlen_ro, rotary_dim / 2], "
            f"got {list(cos.shape)} and {list(sin.shape)}"
        )
    rot_dim = 2 * cos.shape[-1]
    if rot_dim <= 0 or rot_dim > head_dim:
        raise ValueError(
            f"{op}: rotary_dim = 2 * {names[0]}.shape[-1] = {rot_dim} must be > 0 and <= headdim = {head_dim}"
        )
    c, s = _custom_ops.table_dtype(cos, sin, dtype)
    return c[None, :, None, :], s[None, :, None, :], rot_dim


def _fa_offsets(op: str, seqlen_offsets) -> Tuple[int, Optional[torch.Tensor]]:
    """flash-attn ``seqlen_offsets``: an int, or one offset per sequence (int32 / int64 tensor)."""
    if isinstance(seqlen_offsets, torch.Tensor):
        if seqlen_offsets.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"{op}: seqlen_offsets must be an int or an int32 / int64 tensor, got {seqlen_offsets.dtype}"
            )
        return 0, seqlen_offsets.to(torch.int32)
    return int(seqlen_offsets), None


def _flash_autograd(*tensors: torch.Tensor) -> bool:
    """The in-place flash-attn forms go through `_custom_ops.FlashInplace` when autograd records
    the call (eager only: under torch.compile they keep the functional form plus ``copy_``)."""
    return _custom_ops._requires_grad(*tensors) and not torch.compiler.is_compiling()


def _flash_inplace(x, split, rot_dims, offsets, cu, offset, interleaved, enable_pdl, *tables):
    options = (tuple(rot_dims), offsets, cu, offset, bool(interleaved), enable_pdl)
    return _custom_ops.FlashInplace.apply(x, split, options, *tables)


def apply_rotary_emb(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool = False,
    inplace: bool = False,
    seqlen_offsets: Union[int, torch.Tensor] = 0,
    cu_seqlens: Optional[torch.Tensor] = None,
    max_seqlen: Optional[int] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """flash-attn ``apply_rotary_emb`` (flash_attn.layers.rotary), differentiable.

    ``x`` ``[B, S, H, D]``, or ``[total_tokens, H, D]`` with ``cu_seqlens`` ``[B + 1]``
    (varlen); ``cos``, ``sin`` ``[seqlen_ro, rotary_dim / 2]`` (``rotary_dim <= D``); token
    ``s`` of sequence ``b`` uses row ``s + seqlen_offsets`` (an int, or a ``[B]`` tensor).
    ``interleaved``: GPT-J pairs, else NeoX. Returns a new tensor, or ``x`` rotated in place
    (``inplace=True``; under autograd, as in flash-attn, ``x`` may be a leaf that requires grad
    or a view of one: the returned alias of ``x`` carries the rotation into the graph). ``max_seqlen`` is accepted and not needed. Gradients flow to ``x`` (and
    to cos / sin if they require grad, which flash-attn does not offer).
    """
    op = "apply_rotary_emb"
    varlen = cu_seqlens is not None
    if x.dim() != (3 if varlen else 4):
        raise ValueError(
            f"{op}: x must have shape "
            + ("[total_tokens, H, D] with cu_seqlens" if varlen else "[B, S, H, D]")
            + f", got {list(x.shape)}"
        )
    _check_activation(op, "x", x)
    cos4, sin4, rot_dim = _fa_tables(op, cos, sin, x.dtype, x.shape[-1])
    offset, offsets = _fa_offsets(op, seqlen_offsets)
    cu = None
    if varlen:
        cu = (
            cu_seqlens if cu_seqlens.dtype == torch.int32 else cu_seqlens.to(torch.int32)
        ).contiguous()
    if inplace and _flash_autograd(x, cos4, sin4):
        split = (lambda t: [(t.unsqueeze(0), None)]) if varlen else (lambda t: [(t, None)])
        return _flash_inplace(
            x, split, (rot_dim,), offsets, cu, offset, interleaved, enable_pdl, cos4, sin4
        )
    x4 = x.unsqueeze(0) if varlen else x
    out, _ = _custom_ops.rope(
        x4,
        None,
        cos4,
        sin4,
        rot_dim=rot_dim,
        seqlen_offsets=offsets,
        cu_seqlens=cu,
        seqlen_offset=offset,
        interleaved=interleaved,
        inplace=inplace,
        enable_pdl=enable_pdl,
    )
    if inplace:
        return x
    return out.squeeze(0) if varlen else out


def apply_rotary_emb_qkv_(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cos_k: Optional[torch.Tensor] = None,
    sin_k: Optional[torch.Tensor] = None,
    interleaved: bool = False,
    seqlen_offsets: Union[int, torch.Tensor] = 0,
    num_heads_q: Optional[int] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """flash-attn ``apply_rotary_emb_qkv_``: rotates Q and K of a packed qkv in place, returns qkv.

    ``qkv`` ``[B, S, 3, H, D]``, or ``[B, S, Hq + 2 * Hk, D]`` with ``num_heads_q = Hq``
    (MQA / GQA). ``cos_k`` / ``sin_k``: K's own tables (default: Q's). Differentiable as in
    flash-attn: ``qkv`` may be a leaf that requires grad (or a view of one); the gradient of
    qkv is the transposed rotation of Q's and K's gradients, V's passed through.
    """
    op = "apply_rotary_emb_qkv_"
    _check_activation(op, "qkv", qkv)
    if qkv.dim() == 5:
        if qkv.shape[2] != 3:
            raise ValueError(f"{op}: qkv must have shape [B, S, 3, H, D], got {list(qkv.shape)}")

        def q_and_k(t):
            return t[:, :, 0], t[:, :, 1]

    elif qkv.dim() == 4:
        if num_heads_q is None:
            raise ValueError(
                f"{op}: qkv of shape [B, S, Hq + 2 * Hk, D] needs num_heads_q, got {list(qkv.shape)}"
            )
        num_heads_k = (qkv.shape[2] - num_heads_q) // 2
        if num_heads_q <= 0 or num_heads_k <= 0 or num_heads_q + 2 * num_heads_k != qkv.shape[2]:
            raise ValueError(
                f"{op}: qkv.shape[2] = {qkv.shape[2]} must be num_heads_q + 2 * num_heads_k with num_heads_q = {num_heads_q}"
            )

        def q_and_k(t):
            return t[:, :, :num_heads_q], t[:, :, num_heads_q : num_heads_q + num_heads_k]

    else:
        raise ValueError(
            f"{op}: qkv must have shape [B, S, 3, H, D] or [B, S, Hq + 2 * Hk, D], got {list(qkv.shape)}"
        )
    if (cos_k is None) != (sin_k is None):
        raise ValueError(f"{op}: cos_k and sin_k must be given together or not at all")
    head_dim = qkv.shape[-1]
    cos4, sin4, rot_dim = _fa_tables(op, cos, sin, qkv.dtype, head_dim)
    offset, offsets = _fa_offsets(op, seqlen_offsets)
    options = dict(
        seqlen_offsets=offsets,
        seqlen_offset=offset,
        interleaved=interleaved,
        inplace=True,
        enable_pdl=enable_pdl,
    )
    if cos_k is None:
        if _flash_autograd(qkv, cos4, sin4):
            return _flash_inplace(
                qkv,
                lambda t: [q_and_k(t)],
                (rot_dim,),
                offsets,
                None,
                offset,
                interleaved,
                enable_pdl,
                cos4,
                sin4,
            )
        q, k = q_and_k(qkv)
        _custom_ops.rope(q, k, cos4, sin4, rot_dim=rot_dim, **options)
    else:
        cos4k, sin4k, rot_dim_k = _fa_tables(
            op, cos_k, sin_k, qkv.dtype, head_dim, names=("cos_k", "sin_k")
        )
        if _flash_autograd(qkv, cos4, sin4, cos4k, sin4k):
            return _flash_inplace(
                qkv,
                lambda t: [(q_and_k(t)[0], None), (q_and_k(t)[1], None)],
                (rot_dim, rot_dim_k),
                offsets,
                None,
                offset,
                interleaved,
                enable_pdl,
                cos4,
                sin4,
                cos4k,
                sin4k,
            )
        q, k = q_and_k(qkv)
        _custom_ops.rope(q, None, cos4, sin4, rot_dim=rot_dim, **options)
        _custom_ops.rope(k, None, cos4k, sin4k, rot_dim=rot_dim_k, **options)
    return qkv


def apply_rotary_emb_kv_(
    kv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool = False,
    seqlen_offsets: Union[int, torch.Tensor] = 0,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """flash-attn ``apply_rotary_emb_kv_``: rotates K of ``kv [B, S, 2, H, D]`` in place, returns kv.
    Differentiable as in flash-attn, also for a ``kv`` that is a leaf requiring grad."""
    op = "apply_rotary_emb_kv_"
    _check_activation(op, "kv", kv)
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError(f"{op}: kv must have shape [B, S, 2, H, D], got {list(kv.shape)}")
    cos4, sin4, rot_dim = _fa_tables(op, cos, sin, kv.dtype, kv.shape[-1])
    offset, offsets = _fa_offsets(op, seqlen_offsets)
    if _flash_autograd(kv, cos4, sin4):
        return _flash_inplace(
            kv,
            lambda t: [(t[:, :, 0], None)],
            (rot_dim,),
            offsets,
            None,
            offset,
            interleaved,
            enable_pdl,
            cos4,
            sin4,
        )
    _custom_ops.rope(
        kv[:, :, 0],
        None,
        cos4,
        sin4,
        rot_dim=rot_dim,
        seqlen_offsets=offsets,
        seqlen_offset=offset,
        interleaved=interleaved,
        inplace=True,
        enable_pdl=enable_pdl,
    )
    return kv


# ---- kernels-community rotary and transformers ----


def apply_rotary(
    x1: torch.Tensor,
    x2: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    out1: torch.Tensor,
    out2: torch.Tensor,
    conj: bool,
    enable_pdl: Optional[bool] = None,
) -> None:
    """kernels-community ``rotary`` ``apply_rotary``: writes ``out1 = x1 cos - x2 sin`` and
    ``out2 = x1 sin + x2 cos`` (``conj``: ``x1 cos + x2 sin`` and ``x2 cos - x1 sin``).

    cos/sin broadcast against x1 (TensorIterator rules); ``out`` may be ``x`` (in place). Runs
    the kernel when x1/x2 (and out1/out2) are the two halves of one tensor, as
    ``apply_rotary_transformers`` of kernels-community passes them; otherwise an exact ATen
    fallback with the same fp32 math. Not seen by autograd.
    """
    ops.apply_rotary(x1, x2, cos, sin, out1, out2, bool(conj), enable_pdl)


def apply_rotary_transformers(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    unsqueeze_dim: int = 1,
    enable_pdl: Optional[bool] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """transformers ``apply_rotary_pos_emb``: returns new ``(q_embed, k_embed)``.

    Computes ``q * cos + rotate_half(q) * sin`` with the full cos/sin (the two halves need not
    be equal), in fp32 with one rounding to ``promote_types(q, cos, sin)``, the dtype eager
    PyTorch returns. ``q``/``k`` ``[B, H, S, D]`` (``unsqueeze_dim=1``) or ``[B, S, H, D]``
    (``unsqueeze_dim=2``); ``cos``/``sin`` ``[B or 1, S, R]``. ``R < D``: partial rotary, the
    first ``R`` channels rotated and the rest passed through (GPT-NeoX / Phi style). Note that
    gpt-oss's half-size tables (``R = D / 2`` covering the whole head) are a different
    convention. Differentiable w.r.t. q, k, cos and sin; the outputs keep q's memory layout.
    """
    return _custom_ops.transformers_rope(q, k, cos, sin, unsqueeze_dim, enable_pdl=enable_pdl)


apply_rotary_transformers.has_backward = True
apply_rotary_transformers.can_torch_compile = True


def apply_rotary_pos_emb(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: Optional[torch.Tensor] = None,
    unsqueeze_dim: int = 1,
    enable_pdl: Optional[bool] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """transformers' function name and pre-5.x signature: ``apply_rotary_transformers``;
    ``position_ids`` is accepted and unused (cos/sin are already gathered per position)."""
    return _custom_ops.transformers_rope(
        q, k, cos, sin, unsqueeze_dim, op="apply_rotary_pos_emb", enable_pdl=enable_pdl
    )


# ---- diffusers LTX-Video ----


def apply_rotary_emb_ltx(
    x: torch.Tensor, freqs: Tuple[torch.Tensor, torch.Tensor], enable_pdl: Optional[bool] = None
) -> torch.Tensor:
    """diffusers LTX-Video ``apply_rotary_emb(x, freqs)`` (``transformer_ltx``), differentiable.

    ``x`` ``[B, S, C]``; ``freqs = (cos, sin)``, each ``[B or 1, S, C]``: one coefficient per
    channel, interleaved pairs ``(x[2i], x[2i + 1])``. Returns ``(x.float() * cos +
    rotated.float() * sin).to(x.dtype)``: the kernel's fp32 math gives diffusers' values bit for
    bit. cos/sin of last dimension ``D`` (even, dividing ``C``) are one head's table used by all
    ``C / D`` heads.
    """
    if not isinstance(freqs, (tuple, list)) or len(freqs) != 2:
        raise ValueError("apply_rotary_emb_ltx: freqs must be a pair (cos, sin)")
    cos, sin = freqs
    return _custom_ops.ltx_rope(x, cos, sin, enable_pdl=enable_pdl)


# An error raised through a public function or a layer names it, not the op it reached
# (_public_errors.py).
from . import _public_errors  # noqa: E402

_public_errors.wrap_public([globals()], __all__, add_op_namespace_prefix)
_public_errors.wrap_layers(layers, add_op_namespace_prefix)
