"""fp8 / int8 GEMMs and the activation quantization they need, on CPU and CUDA: vLLM's quantize
ops and scaled GEMMs (``cutlass_scaled_mm``, ``cutlass_scaled_mm_azp``, the ``supports_*``
probes) and transformers' finegrained-fp8 ``fp8_act_quant`` and ``matmul_2d``.

The GEMMs compute ``act(scale_a * scale_b * (a @ b - zp) + bias)`` with exact int32 (int8) or
float32 (fp8) accumulation, scales per tensor, token, channel or 128-blocks (fp8), and one
rounding to float16 / bfloat16; their docstrings give the layouts.

W8A8 linear layers (quantized_linear.py): ``QuantizedLinear`` (an 8-bit weight, activations
quantized at each call, the GEMM ``cutlass_scaled_mm``), ``replace_linear_with_quantized(model)``
and ``calibrate_input_scales(model)`` for static activation scales.

What follows is about the quantize ops.

Inputs are float32, float16 or bfloat16 of shape ``[..., hidden]`` (any leading dimensions; rows
with any stride between them are read in place, other layouts through a contiguous copy).
M below is the number of rows, the product of the leading dimensions. Outputs are float8_e4m3fn or int8
with the input's shape; scales are float32 and zero points int32.

Rounding (vLLM's, the same on CPU and CUDA, bit for bit):

* fp8: the scaled value is clamped to [-448, 448] (saturating; NaN stays NaN, as the positive
  fp8 NaN 0x7f: GPUs drop a NaN's sign), then rounded to the nearest float8_e4m3fn, ties to even. Static and dynamic per-tensor scaling multiply by
  ``1 / scale``; per-token and per-group scaling divide by the scale (as vLLM does).
* Dynamic fp8 scales are ``amax / 448`` floored at ``1 / (448 * 512)`` (an all-zero row or tensor
  quantizes to zeros instead of dividing by zero); per token, ``amax`` is first clamped to
  ``scale_ub``. Group scales are ``max(amax, eps) / 448``.
* int8: round half to even (``torch.round``) and saturate to [-128, 127]; NaN becomes 0 (plus
  the zero point). Dynamic symmetric: ``scale = amax / 127``, ``q = round(x * (127 / amax))``
  (an all-zero row has scale 0 and quantizes to 0). Dynamic asymmetric: ``scale = (max - min) /
  255``, ``azp = round(-128 - min / scale)``, ``q = round(x / scale) + azp``; a constant row
  widens its range to include 0, an all-zero row (or one without a number: empty, all NaN)
  gets scale 0 and azp -128.
* ``amax``, ``min`` and ``max`` skip NaN.

fp8 needs a GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell). Every CUDA call
runs on the current stream of the input's device, synchronizes nothing and allocates only its
outputs, so it can be captured in a CUDA graph; torch.compile(fullgraph=True) traces them.
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from . import _custom_ops, _reference, int4, quantized_linear
from ._ops import add_op_namespace_prefix, ops
from .int4 import (
    awq_repack,
    awq_unrepack,
    awq_zeros,
    gptq_repack,
    gptq_unrepack,
    int4_pack,
    int4_unpack,
    w4a16_gemm,
    w4a16_gemm_gated,
)

# The layers reach the functions below through the package, at call time.
from .quantized_linear import (
    QuantizedGatedMLP,
    QuantizedLinear,
    ReplaceReport,
    calibrate_input_scales,
    load_int4_checkpoint,
    replace_linear_with_quantized,
)

__all__ = [
    "int4_pack",
    "int4_unpack",
    "w4a16_gemm",
    "w4a16_gemm_gated",
    "gptq_repack",
    "gptq_unrepack",
    "awq_repack",
    "awq_unrepack",
    "awq_zeros",
    "load_int4_checkpoint",
    "scaled_fp8_quant",
    "scaled_int8_quant",
    "per_token_group_quant_fp8",
    "fp8_act_quant",
    "cutlass_scaled_mm",
    "cutlass_scaled_mm_azp",
    "cutlass_scaled_mm_supports_fp8",
    "cutlass_scaled_mm_supports_block_fp8",
    "matmul_2d",
    # Fused epilogues of unquantized and gated GEMMs
    "linear_act",
    "pack_gate_up",
    "unpack_gate_up",
    "cutlass_scaled_mm_gated",
    "linear_gated",
    # W8A8 linear layers (quantized_linear.py)
    "QuantizedLinear",
    "QuantizedGatedMLP",
    "ReplaceReport",
    "replace_linear_with_quantized",
    "calibrate_input_scales",
]

FP8_MAX = 448.0
# K and N extent of one block of blockwise fp8 scales (matmul_2d's block_size).
_BLOCK = 128


def _check_input(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: input must be a tensor, got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError(
            f"{name}: input must have at least one dimension [..., hidden], got a 0-d tensor"
        )
    if x.dtype not in _custom_ops.INPUT_DTYPES:
        raise ValueError(
            f"{name}: input must be float32, float16 or bfloat16, got "
            f"{_custom_ops.dtype_name(x.dtype)}"
        )


def scaled_fp8_quant(
    input: torch.Tensor,
    scale: Optional[torch.Tensor] = None,
    num_token_padding: Optional[int] = None,
    scale_ub: Optional[torch.Tensor] = None,
    use_per_token_if_dynamic: bool = False,
    output: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``input`` to float8_e4m3fn; returns ``(q, scale)`` (vLLM's ``scaled_fp8_quant``).

    * ``scale`` given (one float32 element): static per-tensor quantization with it.
    * ``scale`` None: dynamic, per tensor (scale of shape [1]) or, with
      ``use_per_token_if_dynamic``, per token (scale of shape [M, 1]); ``scale_ub`` (one float32
      element) bounds each token's amax.
    * ``num_token_padding``: q gets ``max(num_token_padding, input.shape[0])`` rows along its
      first dimension; the padding rows are left unwritten.
    * ``output``: write q there (float8_e4m3fn, the padded shape, unit stride along rows).
    """
    name = "scaled_fp8_quant"
    _check_input(name, input)
    shape = tuple(input.shape)
    if num_token_padding is not None:
        shape = (max(int(num_token_padding), shape[0]),) + shape[1:]
    if output is None:
        output = torch.empty(shape, dtype=_custom_ops.FP8, device=input.device)
    elif tuple(output.shape) != shape or output.dtype != _custom_ops.FP8:
        raise ValueError(
            f"{name}: output must be float8_e4m3fn of shape {list(shape)}, got "
            f"{_custom_ops.dtype_name(output.dtype)} of shape {list(output.shape)}"
        )
    q = output if shape[0] == input.shape[0] else output.narrow(0, 0, input.shape[0])
    if scale is not None:
        if scale.numel() != 1:
            raise ValueError(
                f"{name}: a static scale must have one element (per-tensor), got shape "
                f"{list(scale.shape)}; pass scale=None for dynamic per-token scales"
            )
        if scale_ub is not None:
            raise ValueError(f"{name}: scale_ub applies to dynamic per-token scales only")
        ops.static_scaled_fp8_quant(q, input, scale)
        return output, scale
    if use_per_token_if_dynamic:
        scale = torch.empty(
            (_custom_ops.rows_of(input), 1), dtype=torch.float32, device=input.device
        )
        ops.dynamic_per_token_scaled_fp8_quant(q, input, scale, scale_ub)
        return output, scale
    if scale_ub is not None:
        raise ValueError(
            f"{name}: scale_ub applies to dynamic per-token scales only "
            "(use_per_token_if_dynamic=True)"
        )
    scale = torch.empty(1, dtype=torch.float32, device=input.device)
    ops.dynamic_scaled_fp8_quant(q, input, scale)
    return output, scale


def scaled_int8_quant(
    input: torch.Tensor,
    scale: Optional[torch.Tensor] = None,
    azp: Optional[torch.Tensor] = None,
    symmetric: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Quantize ``input`` to int8; returns ``(q, scale, azp)`` (vLLM's ``scaled_int8_quant``).

    * ``scale`` given (one float32 element): static per-tensor quantization, symmetric without
      ``azp``, asymmetric with ``azp`` (one int32 element; needs ``symmetric=False``).
    * ``scale`` None: dynamic per token; scale of shape [M, 1] and, when not ``symmetric``, azp
      of shape [M, 1] (int32), else None.
    """
    name = "scaled_int8_quant"
    _check_input(name, input)
    output = torch.empty(input.shape, dtype=torch.int8, device=input.device)
    if scale is not None:
        if scale.numel() != 1:
            raise ValueError(
                f"{name}: a static scale must have one element (per-tensor), got shape "
                f"{list(scale.shape)}; pass scale=None for dynamic per-token scales"
            )
        if symmetric != (azp is None):
            raise ValueError(
                f"{name}: azp must be given exactly when symmetric=False (got symmetric="
                f"{symmetric} and azp {'None' if azp is None else 'given'})"
            )
        ops.static_scaled_int8_quant(output, input, scale, azp)
        return output, scale, azp
    if azp is not None:
        raise ValueError(f"{name}: azp is only an input of static quantization (scale given)")
    rows = _custom_ops.rows_of(input)
    scales = torch.empty((rows, 1), dtype=torch.float32, device=input.device)
    zero_points = (
        None if symmetric else torch.empty((rows, 1), dtype=torch.int32, device=input.device)
    )
    ops.dynamic_scaled_int8_quant(output, input, scales, zero_points)
    return output, scales, zero_points


def per_token_group_quant_fp8(
    x: torch.Tensor,
    group_size: int = 128,
    eps: float = 1e-10,
    dtype: Optional[torch.dtype] = None,
    column_major_scales: bool = False,
    *,
    use_ue8m0: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantize each group of ``group_size`` consecutive elements of every row to float8_e4m3fn
    with its own scale ``max(amax, eps) / 448`` (a power of two with ``use_ue8m0``); returns
    ``(q, scales)`` with scales of shape ``[..., hidden // group_size]`` (vLLM's
    ``per_token_group_quant_fp8``). ``column_major_scales`` stores the scales with the token
    dimension(s) contiguous, the layout DeepGEMM-style GEMMs read. The positional order is
    vLLM's; ``dtype`` (vLLM's fp8 dtype argument) may only be None or float8_e4m3fn.
    """
    name = "per_token_group_quant_fp8"
    _check_input(name, x)
    if dtype is not None and dtype != _custom_ops.FP8:
        raise ValueError(f"{name}: dtype must be None or torch.float8_e4m3fn, got {dtype}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise ValueError(f"{name}: group_size must be a positive int, got {group_size!r}")
    hidden = x.shape[-1]
    if hidden % group_size != 0:
        raise ValueError(
            f"{name}: group_size must divide the last dimension of x ({hidden}), got {group_size}"
        )
    groups = hidden // group_size
    q = torch.empty(x.shape, dtype=_custom_ops.FP8, device=x.device)
    if column_major_scales:
        scales = torch.empty((groups, *x.shape[:-1]), dtype=torch.float32, device=x.device).movedim(
            0, -1
        )
    else:
        scales = torch.empty((*x.shape[:-1], groups), dtype=torch.float32, device=x.device)
    ops.per_token_group_fp8_quant(
        x, q, scales, group_size, float(eps), -FP8_MAX, FP8_MAX, bool(use_ue8m0)
    )
    return q, scales


def fp8_act_quant(x: torch.Tensor, block_size: int = 128) -> Tuple[torch.Tensor, torch.Tensor]:
    """transformers' finegrained-fp8 activation quantization: ``(q, scales)`` with one float32
    scale ``amax / 448`` per block of ``block_size`` elements of the last dimension, scales of
    shape ``[..., hidden // block_size]``. The same op as ``per_token_group_quant_fp8``: an
    all-zero block gets the scale 1e-10 / 448 instead of 0 (and zeros instead of NaN).
    """
    return per_token_group_quant_fp8(x, group_size=block_size)


def _check_gemm_args(name: str, a, b, out_dtype) -> None:
    """What the wrappers need before allocating out (the op checks the rest)."""
    for arg, what in ((a, "a"), (b, "b")):
        if not isinstance(arg, torch.Tensor):
            raise TypeError(f"{name}: {what} must be a tensor, got {type(arg).__name__}")
    if a.dim() != 2:
        raise ValueError(f"{name}: a must be 2-D [M, K], got shape {list(a.shape)}")
    if b.dim() != 2:
        raise ValueError(f"{name}: b must be 2-D [K, N], got shape {list(b.shape)}")
    if out_dtype not in _custom_ops.GEMM_OUT_DTYPES:
        raise ValueError(
            f"{name}: out_dtype must be torch.float16 or torch.bfloat16, got {out_dtype}"
        )


def cutlass_scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    out_dtype: torch.dtype,
    bias: Optional[torch.Tensor] = None,
    *,
    activation: Optional[str] = None,
) -> torch.Tensor:
    """``act(scale_a * scale_b * (a @ b) + bias)`` as a new [M, N] tensor of ``out_dtype``
    (vLLM's ``cutlass_scaled_mm``, plus a fused ``activation``).

    * ``a`` [M, K] row-major (rows any stride), ``b`` [K, N] column-major (the ``.t()`` of a
      row-major [N, K] weight), both float8_e4m3fn or both int8; K and N multiples of 16; rows
      and columns start on 16-byte boundaries.
    * Scales (float32): ``scale_a`` with 1 element (per tensor) or M ([M, 1], per token),
      ``scale_b`` with 1 or N (per channel), contiguous; or blockwise fp8 (DeepSeek-V3 style),
      ``scale_a`` [M, K / 128] (1 x 128 groups, e.g. from ``per_token_group_quant_fp8``) and
      ``scale_b`` [K / 128, ceil(N / 128)] (128 x 128 blocks, the ``.t()`` of a checkpoint's
      ``weight_scale_inv``).
    * ``bias`` [N] of ``out_dtype``; ``out_dtype`` float16 or bfloat16.
    * ``activation``: None (or "none"), "gelu" (erf), "gelu_tanh" or "silu", applied in float32
      before the one rounding to ``out_dtype``.

    int8 accumulates exactly in int32, fp8 in float32 (on Hopper in the tensor cores'
    accumulator over all of K, as vLLM's kernels and ``use_fast_accum=True``). On CUDA: int8
    from compute capability 8.0, fp8 from 8.9, blockwise fp8 on 9.0
    (``cutlass_scaled_mm_supports_*``).
    """
    name = "cutlass_scaled_mm"
    _check_gemm_args(name, a, b, out_dtype)
    if activation not in _custom_ops.ACTIVATIONS:
        raise ValueError(
            f'{name}: activation must be None, "none", "gelu", "gelu_tanh" or "silu", got '
            f"{activation!r}"
        )
    out = torch.empty((a.shape[0], b.shape[1]), dtype=out_dtype, device=a.device)
    if activation is None or activation == "none":
        ops.cutlass_scaled_mm(out, a, b, scale_a, scale_b, bias)
    else:
        ops.cutlass_scaled_mm_act(out, a, b, scale_a, scale_b, bias, activation)
    return out


def cutlass_scaled_mm_azp(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    out_dtype: torch.dtype,
    azp_adj: torch.Tensor,
    azp: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """int8 GEMM with asymmetric (zero-point) activations, vLLM's ``cutlass_scaled_mm_azp``:
    ``scale_a * scale_b * (a @ b - zp) + bias`` with ``zp[m, n] = azp[m] * azp_adj[n]``
    (per-token zero points ``azp`` [M] int32, ``azp_adj[n]`` the column sums of b) or
    ``zp[m, n] = azp_adj[n]`` (per-tensor zero point folded into ``azp_adj`` [N] int32).
    Operands, scales (not blockwise) and bias as in ``cutlass_scaled_mm``.
    """
    name = "cutlass_scaled_mm_azp"
    _check_gemm_args(name, a, b, out_dtype)
    out = torch.empty((a.shape[0], b.shape[1]), dtype=out_dtype, device=a.device)
    ops.cutlass_scaled_mm_azp(out, a, b, scale_a, scale_b, azp_adj, azp, bias)
    return out


def cutlass_scaled_mm_supports_fp8(cuda_device_capability: int) -> bool:
    """Whether a CUDA build of this kernel has fp8 GEMMs for a GPU of capability
    ``major * 10 + minor`` (8.9 and newer). The CPU build gives the same answer."""
    return ops.cutlass_scaled_mm_supports_fp8(int(cuda_device_capability))


def cutlass_scaled_mm_supports_block_fp8(cuda_device_capability: int) -> bool:
    """Whether a CUDA build of this kernel has blockwise fp8 GEMMs for a GPU of capability
    ``major * 10 + minor`` (9.0). The CPU build gives the same answer."""
    return ops.cutlass_scaled_mm_supports_block_fp8(int(cuda_device_capability))


def matmul_2d(
    A: torch.Tensor,
    B: torch.Tensor,
    Bs: torch.Tensor,
    block_size,
    output_dtype: Optional[torch.dtype] = None,
    activation_scale: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """transformers' finegrained-fp8 ``matmul_2d`` for fp8 weights: ``A @ dequant(B).T`` as
    [..., N] in ``output_dtype`` (default ``A.dtype``; float16 or bfloat16).

    * ``A`` [..., K] float32 / float16 / bfloat16, quantized here to float8_e4m3fn;
      ``B`` [N, K] float8_e4m3fn (row-major weight).
    * Blockwise: ``Bs`` [ceil(N / 128), ceil(K / 128)] float32 with ``block_size`` [128, 128]
      (K a multiple of 128); A is quantized per 1 x 128 group (``fp8_act_quant``), or per
      tensor with the static ``activation_scale`` (one element).
    * Tensor scale: ``Bs`` with one element; A is quantized per token (dynamic), or per tensor
      with ``activation_scale``.

    Other weight formats (MXFP8, MXFP4, other block sizes) raise NotImplementedError.
    """
    name = "matmul_2d"
    for arg, what in ((A, "A"), (B, "B"), (Bs, "Bs")):
        if not isinstance(arg, torch.Tensor):
            raise TypeError(f"{name}: {what} must be a tensor, got {type(arg).__name__}")
    supported = (
        "supported: B float8_e4m3fn [N, K] with Bs of one element (tensor scale) or "
        "[ceil(N / 128), K / 128] and block_size [128, 128]"
    )
    if B.dtype != _custom_ops.FP8 or B.dim() != 2:
        raise NotImplementedError(
            f"{name}: B of dtype {_custom_ops.dtype_name(B.dtype)} and shape {list(B.shape)} is "
            f"not supported ({supported})"
        )
    _check_input(name, A)
    n, k = B.shape
    if A.shape[-1] != k:
        raise ValueError(
            f"{name}: A must have K = {k} (B is [N, K]) in its last dimension, got shape "
            f"{list(A.shape)}"
        )
    out_dtype = A.dtype if output_dtype is None else output_dtype
    if out_dtype not in _custom_ops.GEMM_OUT_DTYPES:
        raise ValueError(
            f"{name}: output_dtype must be torch.float16 or torch.bfloat16 (the GEMM writes "
            f"16-bit outputs), got {out_dtype}"
        )
    if activation_scale is not None and activation_scale.numel() != 1:
        raise ValueError(
            f"{name}: activation_scale must have one element (a static per-tensor scale), got "
            f"shape {list(activation_scale.shape)}"
        )
    a = A.reshape(-1, k)
    if Bs.numel() == 1:
        if activation_scale is None:
            q, scale_a = scaled_fp8_quant(a, use_per_token_if_dynamic=True)
        else:
            q, scale_a = scaled_fp8_quant(a, activation_scale)
        out = cutlass_scaled_mm(q, B.t(), scale_a, Bs, out_dtype)
        return out.reshape(*A.shape[:-1], n)
    blocks = [int(s) for s in block_size] if isinstance(block_size, (list, tuple)) else None
    if blocks != [_BLOCK, _BLOCK]:
        raise NotImplementedError(
            f"{name}: block_size {block_size!r} with Bs of shape {list(Bs.shape)} is not "
            f"supported ({supported})"
        )
    if activation_scale is None:
        q, scale_a = per_token_group_quant_fp8(a, _BLOCK, column_major_scales=True)
    else:
        q, scale = scaled_fp8_quant(a, activation_scale)
        scale_a = scale.reshape(1, 1).expand(a.shape[0], k // _BLOCK)
    out = cutlass_scaled_mm(q, B.t(), scale_a, Bs.t(), out_dtype)
    return out.reshape(*A.shape[:-1], n)


# ---- fused epilogues: linear_act and the gated MLP form ----
#
# Their CUDA kernels are Hopper's (capability 9.0, the "auto" GEMM path); the ops refuse other
# GPUs. The wrappers therefore choose: the fused op on the CPU and on such a GPU, else an unfused
# fallback of plain GEMMs and torch activations with the same result up to rounding. The choice
# is plain Python (device properties and the mirrored path below), so torch.compile traces it
# without a graph break.

# The GEMM path of _set_scaled_mm_path, mirrored for the choice above.
_scaled_mm_path = "auto"

# Activations of the unfused fallbacks, applied in float32 like the fused epilogue.
_TORCH_ACTIVATIONS = {
    "none": lambda x: x,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


def _set_scaled_mm_path(path: str) -> None:
    """The CUDA GEMM family: "auto" (Hopper kernels on capability 9.0) or "sm80" (mma.sync on
    every GPU; linear_act and the gated GEMM then take their unfused fallback)."""
    global _scaled_mm_path
    ops._set_scaled_mm_path(path)
    _scaled_mm_path = path


def _fused_epilogue_runs_on(device: torch.device) -> bool:
    """Whether linear_act's and the gated GEMM's fused ops serve `device`. Dynamo folds
    get_device_properties to a constant (get_device_capability would break the graph)."""
    if device.type == "cpu":
        return True
    if device.type != "cuda" or _scaled_mm_path != "auto":
        return False
    props = torch.cuda.get_device_properties(device)
    return (props.major, props.minor) == (9, 0)


def _activation_name(name: str, activation) -> str:
    if activation not in _custom_ops.ACTIVATIONS:
        raise ValueError(
            f'{name}: activation must be None, "none", "gelu", "gelu_tanh" or "silu", got '
            f"{activation!r}"
        )
    return "none" if activation is None else activation


def _check_sixteen_bit(name: str, what: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: {what} must be a tensor, got {type(t).__name__}")
    if t.dtype not in _custom_ops.SIXTEEN_BIT:
        raise ValueError(
            f"{name}: {what} must be bfloat16 or float16, got {_custom_ops.dtype_name(t.dtype)}"
        )


def linear_act(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
) -> torch.Tensor:
    """``act(x @ weight.T + bias)`` for unquantized bfloat16 / float16 tensors: ``x`` [..., K],
    ``weight`` [N, K] and ``bias`` [N] of x's dtype; the result is [..., N] of that dtype.
    ``activation``: None (or "none"), "gelu" (erf), "gelu_tanh" or "silu".

    Fused (the GEMM's epilogue applies bias and activation in float32, one rounding) on the CPU
    and on CUDA capability 9.0 with the "auto" GEMM path, when N and K are multiples of 16;
    elsewhere ``F.linear`` and the torch activation (float32, then rounded).
    """
    name = "linear_act"
    _check_sixteen_bit(name, "x", x)
    _check_sixteen_bit(name, "weight", weight)
    act = _activation_name(name, activation)
    if (
        x.dim() < 1
        or weight.dim() != 2
        or weight.dtype != x.dtype
        or weight.shape[1] != x.shape[-1]
    ):
        raise ValueError(
            f"{name}: weight must be [N, K] of x's dtype with K = x.shape[-1]; got x "
            f"{list(x.shape)} {_custom_ops.dtype_name(x.dtype)}, weight {list(weight.shape)} "
            f"{_custom_ops.dtype_name(weight.dtype)}"
        )
    n, k = weight.shape
    # The fused CUDA kernel of this form is disabled (wrong results in its first H200 run):
    # on CUDA, linear_act is F.linear and the activation.
    if x.device.type == "cpu" and n % 16 == 0 and k % 16 == 0:
        rows = x.reshape(-1, k)
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        if weight.stride(-1) != 1:
            weight = weight.contiguous()
        out = torch.empty((rows.shape[0], n), dtype=x.dtype, device=x.device)
        ops.linear_act(out, rows, weight, bias, act)
        return out.reshape(*x.shape[:-1], n)
    y = F.linear(x, weight, bias)
    if act == "none":
        return y
    return _TORCH_ACTIVATIONS[act](y.float()).to(y.dtype)


def _gate_blocks(t: torch.Tensor, name: str, what: str) -> Tuple[int, Tuple[int, ...]]:
    """(N, trailing shape) of a gate or up tensor [N], [N, 1] or [N, K]."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: {what} must be a tensor, got {type(t).__name__}")
    if t.dim() not in (1, 2) or t.shape[0] % _custom_ops.GATE_BLOCK != 0 or t.shape[0] == 0:
        raise ValueError(
            f"{name}: {what} must be [N], [N, 1] or [N, K] with N a positive multiple of "
            f"{_custom_ops.GATE_BLOCK}, got shape {list(t.shape)}"
        )
    return t.shape[0], tuple(t.shape[1:])


def pack_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The packed gated weight of the fused gated GEMM: ``gate`` and ``up`` of the same shape
    [N, K] (weights), [N] or [N, 1] (per-channel scales, bias) interleaved in blocks of 64 rows,
    gate block j then up block j, as [2N, ...]. N must be a multiple of 64."""
    name = "pack_gate_up"
    n, rest = _gate_blocks(gate, name, "gate")
    _gate_blocks(up, name, "up")
    if up.shape != gate.shape or up.dtype != gate.dtype or up.device != gate.device:
        raise ValueError(
            f"{name}: up must have gate's shape, dtype and device ({list(gate.shape)} "
            f"{_custom_ops.dtype_name(gate.dtype)} on {gate.device}), got {list(up.shape)} "
            f"{_custom_ops.dtype_name(up.dtype)} on {up.device}"
        )
    blocks = n // _custom_ops.GATE_BLOCK
    packed = torch.empty(
        (blocks, 2, _custom_ops.GATE_BLOCK, *rest), dtype=gate.dtype, device=gate.device
    )
    packed[:, 0].copy_(gate.reshape(blocks, _custom_ops.GATE_BLOCK, *rest))
    packed[:, 1].copy_(up.reshape(blocks, _custom_ops.GATE_BLOCK, *rest))
    return packed.reshape(2 * n, *rest)


def unpack_gate_up(packed: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(gate, up)`` from a tensor of ``pack_gate_up`` (new contiguous tensors)."""
    name = "unpack_gate_up"
    two_n, rest = _gate_blocks(packed, name, "packed")
    if two_n % (2 * _custom_ops.GATE_BLOCK) != 0:
        raise ValueError(
            f"{name}: packed must have 2N rows, N a multiple of {_custom_ops.GATE_BLOCK}, got "
            f"shape {list(packed.shape)}"
        )
    blocks = two_n // (2 * _custom_ops.GATE_BLOCK)
    view = packed.reshape(blocks, 2, _custom_ops.GATE_BLOCK, *rest)
    return (
        view[:, 0].reshape(two_n // 2, *rest).clone(),
        view[:, 1].reshape(two_n // 2, *rest).clone(),
    )


def _gate_of_packed(y: torch.Tensor, act: str, out_dtype: torch.dtype) -> torch.Tensor:
    """act(g) * u in float32 from a product [M, 2N] over the packed weight (blocks of 64
    columns: gate, up), rounded to out_dtype: the unfused gated epilogue."""
    m, two_n = y.shape
    blocks = y.float().view(m, two_n // (2 * _custom_ops.GATE_BLOCK), 2, _custom_ops.GATE_BLOCK)
    gated = _TORCH_ACTIVATIONS[act](blocks[:, :, 0]) * blocks[:, :, 1]
    return gated.reshape(m, two_n // 2).to(out_dtype)


def cutlass_scaled_mm_gated(
    a: torch.Tensor,
    b_packed: torch.Tensor,
    scale_a: Optional[torch.Tensor],
    scale_b_packed: Optional[torch.Tensor],
    out_dtype: torch.dtype,
    activation: Optional[str] = "silu",
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The gated MLP product ``act(g) * u`` as a new [M, N] tensor of ``out_dtype``, with
    ``g`` and ``u`` the scaled, biased products of ``a`` with the gate and up halves of
    ``b_packed``.

    * ``a`` [M, K] row-major; ``b_packed`` [K, 2N] column-major, the ``.t()`` of
      ``pack_gate_up(gate_weight, up_weight)`` ([2N, K]); N a multiple of 64, K of 16.
    * float8_e4m3fn / int8 operands: float32 ``scale_a`` with 1 or M elements,
      ``scale_b_packed`` with 1 or 2N (per channel, packed by ``pack_gate_up``); ``out_dtype``
      float16 or bfloat16. bfloat16 / float16 operands: both scales None, ``out_dtype`` theirs.
    * ``bias`` [2N] of ``out_dtype``, packed; ``activation`` None / "none", "gelu",
      "gelu_tanh" or "silu" (applied to the gate).

    Fused on the CPU and on CUDA capability 9.0 with the "auto" GEMM path; elsewhere the plain
    GEMM over the packed weight to [M, 2N] (rounded to ``out_dtype``), then ``act(g) * u``.
    """
    name = "cutlass_scaled_mm_gated"
    _check_gemm_args(name, a, b_packed, out_dtype)
    act = _activation_name(name, activation)
    two_n = b_packed.shape[1]
    if two_n == 0 or two_n % (2 * _custom_ops.GATE_BLOCK) != 0:
        raise ValueError(
            f"{name}: b_packed must be [K, 2N] with N a positive multiple of "
            f"{_custom_ops.GATE_BLOCK} (the .t() of pack_gate_up's weight), got shape "
            f"{list(b_packed.shape)}"
        )
    if _fused_epilogue_runs_on(a.device):
        out = torch.empty((a.shape[0], two_n // 2), dtype=out_dtype, device=a.device)
        ops.scaled_mm_gated(out, a, b_packed, scale_a, scale_b_packed, bias, act)
        return out
    if a.dtype in _custom_ops.SIXTEEN_BIT:
        if scale_a is not None or scale_b_packed is not None:
            raise ValueError(
                f"{name}: bfloat16 / float16 operands take no scales (pass None for scale_a and "
                "scale_b_packed)"
            )
        if out_dtype != a.dtype:
            raise ValueError(
                f"{name}: out_dtype must be the operands' dtype {a.dtype} for 16-bit operands, "
                f"got {out_dtype}"
            )
        y = F.linear(a, b_packed.t(), bias)
    else:
        if scale_a is None or scale_b_packed is None:
            raise ValueError(
                f"{name}: float8_e4m3fn / int8 operands need scale_a and scale_b_packed"
            )
        y = cutlass_scaled_mm(a, b_packed, scale_a, scale_b_packed, out_dtype, bias)
    return _gate_of_packed(y, act, out_dtype)


def linear_gated(
    x: torch.Tensor,
    packed_weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = "silu",
) -> torch.Tensor:
    """The gated MLP input projection ``act(x @ gate.T + bias_g) * (x @ up.T + bias_u)`` for
    bfloat16 / float16: ``x`` [..., K], ``packed_weight = pack_gate_up(gate, up)`` [2N, K] and
    ``bias`` [2N] (``pack_gate_up(bias_g, bias_u)``) of x's dtype; the result is [..., N].
    Fused or unfused as ``cutlass_scaled_mm_gated``."""
    name = "linear_gated"
    _check_sixteen_bit(name, "x", x)
    _check_sixteen_bit(name, "packed_weight", packed_weight)
    if x.dim() < 1 or packed_weight.dim() != 2 or packed_weight.shape[1] != x.shape[-1]:
        raise ValueError(
            f"{name}: packed_weight must be [2N, K] with K = x.shape[-1]; got x {list(x.shape)}, "
            f"packed_weight {list(packed_weight.shape)}"
        )
    k = packed_weight.shape[1]
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = cutlass_scaled_mm_gated(rows, packed_weight.t(), None, None, x.dtype, activation, bias)
    return out.reshape(*x.shape[:-1], out.shape[1])


# An error raised through a public function or QuantizedLinear.forward names it, not the op it
# reached (_public_errors.py).
from . import _public_errors  # noqa: E402

_public_errors.wrap_public([globals()], __all__, add_op_namespace_prefix)
_public_errors.wrap_layers(quantized_linear, add_op_namespace_prefix)
