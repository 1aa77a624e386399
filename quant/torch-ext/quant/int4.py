"""Int4 weight-only GEMM (W4A16): our packed weight layout, the GEMM, and conversion from and to
GPTQ and AWQ checkpoints.

A weight is 4-bit codes ``q[k, n]`` (K input features, N outputs) with a scale ``s`` and a zero
``z`` per group of ``group_size`` consecutive k and per column: ``w = (q - z) * s``, computed in
the activations' dtype (one rounding of an exact product, so the same bits on every device).
GPTQ checkpoints are symmetric (``z = 8``, vLLM's ``uint4b8``); AWQ checkpoints carry zeros.

``w4a16_gemm_gated`` fuses a gated MLP's gate and up projections with ``act(gate) * up``.

``int4_pack`` puts codes ``[K, N]`` (uint8, 0..15) into our layout, int32 ``[K / 16, 2 N]``
(K a multiple of 16, N of 64), in which a GPU warp's 16-byte loads are the tensor-core fragments
(kernel_src/w4a16_layout.h defines it); ``int4_unpack`` inverts it. ``w4a16_gemm(a, b, scales,
zeros=None, perm=None, bias=None)`` computes ``a[..., perm] @ w + bias`` with float32 sums.

Checkpoint formats (what AutoGPTQ / GPTQModel and AutoAWQ write):

* GPTQ: ``qweight`` int32 ``[K / 8, N]``, code of row k in bits ``4 (k % 8)`` of row ``k // 8``;
  ``scales`` ``[K / group, N]``; ``g_idx`` int32 ``[K]``, the group of each row (act-order
  checkpoints shuffle it). ``gptq_repack(qweight, g_idx)`` returns ``(packed, perm)``: rows are
  sorted by group so that each group is contiguous, and ``perm`` (None when the order is already
  sorted) tells the GEMM which column of the activations each packed row multiplies.
* AWQ: ``qweight`` int32 ``[K, N / 8]``, the code of column ``8 c + AWQ_ORDER[i]`` in bits
  ``4 i`` of column c; ``qzeros`` int32 ``[K / group, N / 8]`` packed the same way;
  ``awq_repack(qweight)`` and ``awq_zeros(qzeros, dtype)``.

On CUDA (capability 8.0 or newer) the GEMM is decode-first: mma.sync tiles of 16 rows stream the
packed weight, K split over CTAs when there are few output tiles (deterministic: the partials are
added in a fixed order). ``perm``'s values are not checked on CUDA (reading them would
synchronize): gptq_repack's perm is always valid.
"""

from typing import Optional, Tuple

import torch

from ._ops import ops

# Column order of AWQ's packing: bits 4 i of a word hold column 8 c + AWQ_ORDER[i].
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
TILE_K, TILE_N = 16, 64
CODES_PER_WORD = 8


def int4_pack(codes: torch.Tensor) -> torch.Tensor:
    """Codes [K, N] (uint8, values 0..15) -> our packed layout, int32 [K / 16, 2 N]."""
    if codes.dtype != torch.uint8 or codes.dim() != 2:
        raise ValueError(
            f"int4_pack: codes must be a 2-D uint8 tensor [K, N], got {codes.dtype} of shape "
            f"{list(codes.shape)}"
        )
    if codes.numel() and int(codes.max()) > 15:
        raise ValueError(f"int4_pack: codes must be 0..15, got a maximum of {int(codes.max())}")
    k, n = codes.shape
    if n > 1 and codes.stride(1) != 1:
        codes = codes.contiguous()  # the op reads rows of unit stride
    packed = torch.empty((k // TILE_K, 2 * n), dtype=torch.int32, device=codes.device)
    ops.int4_pack(packed, codes)
    return packed


def int4_unpack(packed: torch.Tensor) -> torch.Tensor:
    """Our packed layout int32 [K / 16, 2 N] -> codes [K, N] (uint8)."""
    if packed.dim() != 2:
        raise ValueError(f"int4_unpack: packed must be 2-D, got shape {list(packed.shape)}")
    codes = torch.empty(
        (packed.shape[0] * TILE_K, packed.shape[1] // 2), dtype=torch.uint8, device=packed.device
    )
    ops.int4_unpack(codes, packed)
    return codes


def _run_gemm(op, out_cols, a, b, scales, zeros, perm, bias, activation) -> torch.Tensor:
    lead = a.shape[:-1]
    a2 = a.reshape(-1, a.shape[-1]) if a.dim() != 2 else a
    if a2.dim() == 2 and a2.shape[-1] > 1 and a2.stride(-1) != 1:
        a2 = a2.contiguous()
    out = torch.empty((a2.shape[0], out_cols), dtype=a.dtype, device=a.device)
    op(out, a2, b, scales, zeros, perm, bias, "none" if activation is None else activation)
    return out.reshape(*lead, out_cols)


def w4a16_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    scales: torch.Tensor,
    zeros: Optional[torch.Tensor] = None,
    perm: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
) -> torch.Tensor:
    """``act(a[..., perm] @ w + bias)`` for a float16 / bfloat16 ``[..., K]`` and the packed weight
    ``b`` (int32 [K / 16, 2 N]); ``scales`` / ``zeros`` ``[K / group_size, N]`` in a's dtype (no
    zeros: 8), ``perm`` int32 [K], ``bias`` [N], ``activation`` None, "gelu", "gelu_tanh" or
    "silu". Products summed in float32, the epilogue in float32, rounded once."""
    return _run_gemm(ops.w4a16_gemm, b.shape[-1] // 2, a, b, scales, zeros, perm, bias, activation)


def w4a16_gemm_gated(
    a: torch.Tensor,
    b: torch.Tensor,
    scales: torch.Tensor,
    zeros: Optional[torch.Tensor] = None,
    perm: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    activation: str = "silu",
) -> torch.Tensor:
    """The gated MLP's first GEMM in one kernel: ``act(a @ w_gate + b_gate) * (a @ w_up + b_up)``,
    ``[..., N / 2]``. ``b``, ``scales``, ``zeros`` and ``bias`` hold gate and up in alternating
    blocks of 64 columns: pack the codes [K, N / 2] of each with ``pack_gate_up(gate.t(),
    up.t()).t()`` (and the group tables the same way) before ``int4_pack``."""
    return _run_gemm(
        ops.w4a16_gemm_gated, b.shape[-1] // 4, a, b, scales, zeros, perm, bias, activation
    )


# ---- checkpoint formats ----

_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 [..., W] -> uint8 [..., W, 8]: nibble i of each word (bits 4 i .. 4 i + 3)."""
    shifts = _SHIFTS.to(words.device)
    return ((words.unsqueeze(-1) >> shifts) & 0xF).to(torch.uint8)


def _words(nibbles: torch.Tensor) -> torch.Tensor:
    """uint8 [..., W, 8] -> int32 [..., W], nibble i in bits 4 i (the inverse of _nibbles)."""
    shifts = _SHIFTS.to(nibbles.device)
    # int64 sums keep bit 31 out of the sign; the cast back wraps to the same 32 bits.
    word = (nibbles.to(torch.int64) << shifts.to(torch.int64)).sum(-1)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def _check_int32(op: str, name: str, t: torch.Tensor) -> None:
    if t.dtype != torch.int32 or t.dim() != 2:
        raise ValueError(
            f"{op}: {name} must be a 2-D int32 tensor, got {t.dtype} of shape {list(t.shape)}"
        )


def gptq_unpack_qweight(qweight: torch.Tensor) -> torch.Tensor:
    """GPTQ ``qweight`` int32 [K / 8, N] -> codes uint8 [K, N]."""
    _check_int32("gptq_repack", "qweight", qweight)
    rows, n = qweight.shape
    return _nibbles(qweight).permute(0, 2, 1).reshape(rows * CODES_PER_WORD, n)


def gptq_pack_qweight(codes: torch.Tensor) -> torch.Tensor:
    """Codes uint8 [K, N] -> GPTQ ``qweight`` int32 [K / 8, N]."""
    k, n = codes.shape
    return _words(codes.reshape(k // CODES_PER_WORD, CODES_PER_WORD, n).permute(0, 2, 1))


def awq_unpack(packed: torch.Tensor) -> torch.Tensor:
    """AWQ-packed int32 [R, N / 8] (``qweight`` or ``qzeros``) -> codes uint8 [R, N]."""
    _check_int32("awq_repack", "qweight / qzeros", packed)
    rows = packed.shape[0]
    nib = _nibbles(packed)  # [R, N / 8, 8], nibble i = column 8 c + AWQ_ORDER[i]
    order = torch.tensor(AWQ_ORDER, device=packed.device).argsort()
    return nib[..., order].reshape(rows, -1)


def awq_pack(codes: torch.Tensor) -> torch.Tensor:
    """Codes uint8 [R, N] -> AWQ-packed int32 [R, N / 8]."""
    rows, n = codes.shape
    by_word = codes.reshape(rows, n // CODES_PER_WORD, CODES_PER_WORD)
    return _words(by_word[..., list(AWQ_ORDER)])


def act_order_perm(g_idx: Optional[torch.Tensor], k: int) -> Optional[torch.Tensor]:
    """The packed-row order that makes each group of ``g_idx`` contiguous (int32 [K]), or None
    when g_idx is None or already sorted. Every group must have K / groups rows."""
    if g_idx is None:
        return None
    if g_idx.shape != (k,):
        raise ValueError(f"gptq_repack: g_idx must have shape [K] = [{k}], got {list(g_idx.shape)}")
    counts = torch.bincount(g_idx.long().cpu())
    if counts.numel() == 0 or bool((counts != counts[0]).any()) or k % counts.numel():
        raise ValueError("gptq_repack: every group of g_idx must hold the same number of rows")
    if bool((g_idx[1:] >= g_idx[:-1]).all()):
        return None
    return torch.argsort(g_idx, stable=True).to(torch.int32)


def gptq_repack(
    qweight: torch.Tensor, g_idx: Optional[torch.Tensor] = None
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """A GPTQ ``qweight`` int32 [K / 8, N] (and its ``g_idx``) -> (our packed weight, perm)."""
    codes = gptq_unpack_qweight(qweight)
    perm = act_order_perm(g_idx, codes.shape[0])
    if perm is not None:
        codes = codes[perm.long()]
    return int4_pack(codes), perm


def gptq_unrepack(packed: torch.Tensor, perm: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The inverse of gptq_repack: our packed weight (and perm) -> GPTQ ``qweight``."""
    codes = int4_unpack(packed)
    if perm is not None:
        unsorted = torch.empty_like(codes)
        unsorted[perm.long()] = codes
        codes = unsorted
    return gptq_pack_qweight(codes)


def awq_repack(qweight: torch.Tensor) -> torch.Tensor:
    """An AWQ ``qweight`` int32 [K, N / 8] -> our packed weight."""
    return int4_pack(awq_unpack(qweight))


def awq_unrepack(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of awq_repack: our packed weight -> AWQ ``qweight``."""
    return awq_pack(int4_unpack(packed))


def awq_zeros(qzeros: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """AWQ ``qzeros`` int32 [K / group, N / 8] -> the GEMM's zeros [K / group, N] of ``dtype``."""
    return awq_unpack(qzeros).to(dtype)


# ---- round-to-nearest quantization of a float weight ----


def quantize_rtn(
    weight: torch.Tensor, group_size: int, zero_point: bool, dtype: torch.dtype
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """A float ``weight`` [N, K] (nn.Linear's) -> (codes uint8 [K, N], scales [K / group, N] of
    ``dtype``, zeros of ``dtype`` or None), round to nearest per group of ``group_size`` rows of K.

    Symmetric (no zero point): ``s = amax / 7``, ``q = clamp(round(w / s), -8, 7) + 8``.
    Asymmetric: the group's range widened to hold 0, ``s = (max - min) / 15``,
    ``z = round(-min / s)``, ``q = clamp(round(w / s) + z, 0, 15)``. The scale is rounded to
    ``dtype`` before the codes are computed from it; an all-zero group gets s = 0 (weights of 0)."""
    w = weight.detach().float().t()  # [K, N]
    k, n = w.shape
    groups = w.reshape(k // group_size, group_size, n)
    if zero_point:
        lo = groups.amin(1).clamp(max=0.0)
        hi = groups.amax(1).clamp(min=0.0)
        scales = ((hi - lo) / 15.0).to(dtype)
    else:
        scales = (groups.abs().amax(1) / 7.0).to(dtype)
    s = scales.float()
    divisor = torch.where(s > 0, s, torch.ones_like(s)).unsqueeze(1)
    if zero_point:
        z = (-lo / divisor.squeeze(1)).round().clamp(0, 15)
        q = ((groups / divisor).round() + z.unsqueeze(1)).clamp(0, 15)
        zeros = z.to(dtype)
    else:
        q = (groups / divisor).round().clamp(-8, 7) + 8
        zeros = None
    return q.reshape(k, n).to(torch.uint8).contiguous(), scales, zeros
