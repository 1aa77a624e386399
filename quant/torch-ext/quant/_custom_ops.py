"""Fake kernels of the C++ quantize ops (private), so torch.compile can trace them.

The C++ library defines vLLM's out-param ops (torch_binding.cpp); none returns a tensor, so the
fakes only validate what a trace can see (dtypes, devices, shapes), with messages that start
with the op name like the C++ checks. The ops without tensor arguments
(cutlass_scaled_mm_supports_*, _set_scaled_mm_path) have one C++ implementation for every
dispatch key, so they need no fake. Each registration passes `add_op_namespace_prefix(...)`
directly (kernel-builder's registration check).
"""

from typing import Sequence

import torch

from ._ops import add_op_namespace_prefix

INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FP8 = torch.float8_e4m3fn
GEMM_OUT_DTYPES = (torch.float16, torch.bfloat16)
# Values of cutlass_scaled_mm's `activation` (None and "none": no activation).
ACTIVATIONS = (None, "none", "gelu", "gelu_tanh", "silu")


def dtype_name(dtype: torch.dtype) -> str:
    """The dtype without the "torch." prefix, as the C++ messages print it."""
    return str(dtype).replace("torch.", "")


def rows_of(x: torch.Tensor) -> int:
    """M: the number of rows of width x.shape[-1] (rows of width 0 count too)."""
    rows = 1
    for size in x.shape[:-1]:
        rows *= size
    return rows


def check_input(op: str, x: torch.Tensor) -> None:
    torch._check(
        x.dim() >= 1,
        lambda: f"{op}: input must have at least one dimension [..., hidden], got a 0-d tensor",
    )
    torch._check(
        x.dtype in INPUT_DTYPES,
        lambda: f"{op}: input must be float32, float16 or bfloat16, got {dtype_name(x.dtype)}",
    )


def _check_dtype(op: str, name: str, t: torch.Tensor, expected: torch.dtype) -> None:
    torch._check(
        t.dtype == expected,
        lambda: f"{op}: {name} must be {dtype_name(expected)}, got {dtype_name(t.dtype)}",
    )


def _check_device(op: str, name: str, t: torch.Tensor, x: torch.Tensor) -> None:
    torch._check(
        t.device == x.device,
        lambda: (
            f"{op}: {name} must be on the device of input (expected {x.device}, got {t.device})"
        ),
    )


def _check_result(op: str, name: str, out: torch.Tensor, x: torch.Tensor, dtype) -> None:
    check_input(op, x)
    _check_dtype(op, name, out, dtype)
    _check_device(op, name, out, x)
    _check_shape(op, name, out, x.shape, "the input shape")


def _check_shape(op: str, name: str, t: torch.Tensor, expected: Sequence[int], what: str) -> None:
    torch._check(
        tuple(t.shape) == tuple(expected),
        lambda: f"{op}: {name} must have shape {list(expected)} ({what}), got {list(t.shape)}",
    )


def _check_aux(
    op: str, name: str, t: torch.Tensor, dtype, numel: int, what: str, x: torch.Tensor
) -> None:
    _check_dtype(op, name, t, dtype)
    _check_device(op, name, t, x)
    torch._check(
        t.numel() == numel,
        lambda: f"{op}: {name} must have {numel} element(s) ({what}), got shape {list(t.shape)}",
    )


def _check_activation(op: str, activation: str) -> None:
    torch._check(
        activation in ACTIVATIONS[1:],
        lambda: (
            f'{op}: activation must be one of "none", "gelu", "gelu_tanh", "silu", got '
            f'"{activation}"'
        ),
    )


@torch.library.register_fake(add_op_namespace_prefix("static_scaled_fp8_quant"))
def _static_scaled_fp8_quant_fake(result, input, scale) -> None:
    op = "static_scaled_fp8_quant"
    _check_result(op, "result", result, input, FP8)
    _check_aux(op, "scale", scale, torch.float32, 1, "a per-tensor scale", input)


@torch.library.register_fake(add_op_namespace_prefix("dynamic_scaled_fp8_quant"))
def _dynamic_scaled_fp8_quant_fake(result, input, scale) -> None:
    op = "dynamic_scaled_fp8_quant"
    _check_result(op, "result", result, input, FP8)
    _check_aux(op, "scale", scale, torch.float32, 1, "a per-tensor scale", input)


@torch.library.register_fake(add_op_namespace_prefix("dynamic_per_token_scaled_fp8_quant"))
def _dynamic_per_token_scaled_fp8_quant_fake(result, input, scale, scale_ub) -> None:
    op = "dynamic_per_token_scaled_fp8_quant"
    _check_result(op, "result", result, input, FP8)
    _check_aux(op, "scale", scale, torch.float32, rows_of(input), "one per token", input)
    if scale_ub is not None:
        _check_aux(op, "scale_ub", scale_ub, torch.float32, 1, "an upper bound of amax", input)


@torch.library.register_fake(add_op_namespace_prefix("static_scaled_int8_quant"))
def _static_scaled_int8_quant_fake(result, input, scale, azp) -> None:
    op = "static_scaled_int8_quant"
    _check_result(op, "result", result, input, torch.int8)
    _check_aux(op, "scale", scale, torch.float32, 1, "a per-tensor scale", input)
    if azp is not None:
        _check_aux(op, "azp", azp, torch.int32, 1, "a per-tensor zero point", input)


@torch.library.register_fake(add_op_namespace_prefix("dynamic_scaled_int8_quant"))
def _dynamic_scaled_int8_quant_fake(result, input, scale, azp) -> None:
    op = "dynamic_scaled_int8_quant"
    _check_result(op, "result", result, input, torch.int8)
    _check_aux(op, "scale", scale, torch.float32, rows_of(input), "one per token", input)
    if azp is not None:
        _check_aux(op, "azp", azp, torch.int32, rows_of(input), "one per token", input)


@torch.library.register_fake(add_op_namespace_prefix("per_token_group_fp8_quant"))
def _per_token_group_fp8_quant_fake(
    input, output_q, output_s, group_size, eps, fp8_min, fp8_max, scale_ue8m0
) -> None:
    op = "per_token_group_fp8_quant"
    torch._check(group_size > 0, lambda: f"{op}: group_size must be positive, got {group_size}")
    check_input(op, input)
    hidden = input.shape[-1]
    torch._check(
        hidden % group_size == 0,
        lambda: (
            f"{op}: group_size must divide the last dimension of input ({hidden}), got {group_size}"
        ),
    )
    _check_result(op, "output_q", output_q, input, FP8)
    _check_dtype(op, "output_s", output_s, torch.float32)
    _check_device(op, "output_s", output_s, input)
    _check_shape(
        op,
        "output_s",
        output_s,
        (*input.shape[:-1], hidden // group_size),
        "the input shape with the last dimension divided by group_size",
    )


def _check_gemm(op: str, out, a, b) -> None:
    """The checks of scaled_mm_ops.cpp's check_gemm that a trace can see."""
    torch._check(
        (a.dtype == FP8 and b.dtype == FP8) or (a.dtype == torch.int8 and b.dtype == torch.int8),
        lambda: (
            f"{op}: a and b must both be float8_e4m3fn or both int8, got "
            f"{dtype_name(a.dtype)} and {dtype_name(b.dtype)}"
        ),
    )
    torch._check(a.dim() == 2, lambda: f"{op}: a must be 2-D [M, K], got shape {list(a.shape)}")
    torch._check(b.dim() == 2, lambda: f"{op}: b must be 2-D [K, N], got shape {list(b.shape)}")
    m, k = a.shape
    n = b.shape[1]
    torch._check(
        b.shape[0] == k,
        lambda: (
            f"{op}: b must have K = {k} rows (a is [M, K], b [K, N]), got shape {list(b.shape)}"
        ),
    )
    torch._check(
        out.dtype in GEMM_OUT_DTYPES,
        lambda: f"{op}: out must be float16 or bfloat16, got {dtype_name(out.dtype)}",
    )
    _check_shape(op, "out", out, (m, n), "[M, N]")


def _check_scales(op: str, out, a_scales, b_scales, bias) -> None:
    for name, t in (("a_scales", a_scales), ("b_scales", b_scales)):
        _check_dtype(op, name, t, torch.float32)
    if bias is not None:
        _check_dtype(op, "bias", bias, out.dtype)
        _check_shape(op, "bias", bias, (out.shape[1],), "[N], one per output column")


@torch.library.register_fake(add_op_namespace_prefix("cutlass_scaled_mm"))
def _cutlass_scaled_mm_fake(out, a, b, a_scales, b_scales, bias) -> None:
    op = "cutlass_scaled_mm"
    _check_gemm(op, out, a, b)
    _check_scales(op, out, a_scales, b_scales, bias)


@torch.library.register_fake(add_op_namespace_prefix("cutlass_scaled_mm_act"))
def _cutlass_scaled_mm_act_fake(out, a, b, a_scales, b_scales, bias, activation) -> None:
    op = "cutlass_scaled_mm_act"
    _check_gemm(op, out, a, b)
    _check_scales(op, out, a_scales, b_scales, bias)
    _check_activation(op, activation)


@torch.library.register_fake(add_op_namespace_prefix("cutlass_scaled_mm_azp"))
def _cutlass_scaled_mm_azp_fake(out, a, b, a_scales, b_scales, azp_adj, azp, bias) -> None:
    op = "cutlass_scaled_mm_azp"
    _check_gemm(op, out, a, b)
    torch._check(
        a.dtype == torch.int8, lambda: f"{op}: zero points need int8 operands, got float8_e4m3fn"
    )
    _check_scales(op, out, a_scales, b_scales, bias)
    _check_dtype(op, "azp_adj", azp_adj, torch.int32)
    _check_shape(op, "azp_adj", azp_adj, (out.shape[1],), "[N], one per output column")
    if azp is not None:
        _check_dtype(op, "azp", azp, torch.int32)


SIXTEEN_BIT = (torch.bfloat16, torch.float16)
# Width of the gate / up blocks of a packed gated weight (kGateBlock of scaled_mm_params.h).
GATE_BLOCK = 64


@torch.library.register_fake(add_op_namespace_prefix("linear_act"))
def _linear_act_fake(out, x, weight, bias, activation) -> None:
    op = "linear_act"
    torch._check(
        x.dtype in SIXTEEN_BIT and weight.dtype == x.dtype,
        lambda: (
            f"{op}: a and b must both be bfloat16 or both float16, got {dtype_name(x.dtype)} "
            f"and {dtype_name(weight.dtype)}"
        ),
    )
    torch._check(x.dim() == 2, lambda: f"{op}: a must be 2-D [M, K], got shape {list(x.shape)}")
    torch._check(
        weight.dim() == 2,
        lambda: f"{op}: weight must be 2-D [N, K], got shape {list(weight.shape)}",
    )
    _check_dtype(op, "out", out, x.dtype)
    _check_shape(op, "out", out, (x.shape[0], weight.shape[0]), "[M, N]")
    if bias is not None:
        _check_dtype(op, "bias", bias, out.dtype)
        _check_shape(op, "bias", bias, (weight.shape[0],), "[N], one per output column")
    _check_activation(op, activation)


@torch.library.register_fake(add_op_namespace_prefix("scaled_mm_gated"))
def _scaled_mm_gated_fake(out, a, b, a_scales, b_scales, bias, activation) -> None:
    op = "scaled_mm_gated"
    torch._check(
        a.dtype == b.dtype and a.dtype in (FP8, torch.int8, *SIXTEEN_BIT),
        lambda: (
            f"{op}: a and b must have one dtype: float8_e4m3fn, int8, bfloat16 or float16, got "
            f"{dtype_name(a.dtype)} and {dtype_name(b.dtype)}"
        ),
    )
    torch._check(a.dim() == 2, lambda: f"{op}: a must be 2-D [M, K], got shape {list(a.shape)}")
    torch._check(b.dim() == 2, lambda: f"{op}: b must be 2-D [K, 2N], got shape {list(b.shape)}")
    torch._check(
        b.shape[1] % (2 * GATE_BLOCK) == 0,
        lambda: (
            f"{op}: b must be a packed gate / up weight [K, 2N] with N a positive multiple of "
            f"{GATE_BLOCK} (pack_gate_up), got shape {list(b.shape)}"
        ),
    )
    n = b.shape[1] // 2
    if a.dtype in SIXTEEN_BIT:
        _check_dtype(op, "out", out, a.dtype)
    else:
        torch._check(
            out.dtype in GEMM_OUT_DTYPES,
            lambda: f"{op}: out must be float16 or bfloat16, got {dtype_name(out.dtype)}",
        )
        torch._check(
            a_scales is not None and b_scales is not None,
            lambda: f"{op}: float8_e4m3fn / int8 operands need a_scales and b_scales",
        )
    _check_shape(op, "out", out, (a.shape[0], n), "[M, N]")
    if bias is not None:
        _check_dtype(op, "bias", bias, out.dtype)
        _check_shape(op, "bias", bias, (2 * n,), "[2N], packed like b")
    _check_activation(op, activation)


# ---- int4 weight-only (w4a16_ops.cpp) ----


@torch.library.register_fake(add_op_namespace_prefix("int4_pack"))
def _int4_pack_fake(packed, codes) -> None:
    op = "int4_pack"
    _check_dtype(op, "codes", codes, torch.uint8)
    _check_dtype(op, "packed", packed, torch.int32)
    torch._check(codes.dim() == 2, lambda: f"{op}: codes must be 2-D [K, N]")
    k, n = codes.shape
    _check_shape(op, "packed", packed, (k // 16, 2 * n), "[K / 16, 2 N] for codes [K, N]")


@torch.library.register_fake(add_op_namespace_prefix("int4_unpack"))
def _int4_unpack_fake(codes, packed) -> None:
    _int4_pack_fake(packed, codes)


def _check_w4a16(op, out, a, b, scales, zeros, perm, bias, activation, gated) -> None:
    torch._check(
        a.dtype in SIXTEEN_BIT,
        lambda: f"{op}: a must be float16 or bfloat16, got {dtype_name(a.dtype)}",
    )
    torch._check(a.dim() == 2, lambda: f"{op}: a must be 2-D [M, K], got shape {list(a.shape)}")
    _check_dtype(op, "b", b, torch.int32)
    m, k, n = a.shape[0], a.shape[1], b.shape[-1] // 2
    _check_shape(op, "b", b, (k // 16, 2 * n), f"[K / 16, 2 N] with K = {k}")
    _check_dtype(op, "out", out, a.dtype)
    _check_shape(op, "out", out, (m, n // 2 if gated else n), "[M, N / 2]" if gated else "[M, N]")
    _check_dtype(op, "scales", scales, a.dtype)
    torch._check(
        scales.dim() == 2 and scales.shape[1] == n,
        lambda: f"{op}: scales must be [K / group_size, N] with N = {n}",
    )
    if zeros is not None:
        _check_dtype(op, "zeros", zeros, a.dtype)
        _check_shape(op, "zeros", zeros, scales.shape, "the shape of scales, [K / group, N]")
    if perm is not None:
        _check_dtype(op, "perm", perm, torch.int32)
        _check_shape(op, "perm", perm, (k,), "[K], a's column for each packed row")
    if bias is not None:
        _check_dtype(op, "bias", bias, a.dtype)
        _check_shape(op, "bias", bias, (n,), "[N], one per column of b")
    _check_activation(op, activation)


@torch.library.register_fake(add_op_namespace_prefix("w4a16_gemm"))
def _w4a16_gemm_fake(out, a, b, scales, zeros, perm, bias, activation) -> None:
    _check_w4a16("w4a16_gemm", out, a, b, scales, zeros, perm, bias, activation, False)


@torch.library.register_fake(add_op_namespace_prefix("w4a16_gemm_gated"))
def _w4a16_gemm_gated_fake(out, a, b, scales, zeros, perm, bias, activation) -> None:
    _check_w4a16("w4a16_gemm_gated", out, a, b, scales, zeros, perm, bias, activation, True)
