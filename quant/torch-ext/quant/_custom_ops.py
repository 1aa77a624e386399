"""Fake kernels of the C++ quantize ops (private), so torch.compile can trace them.

The C++ library defines vLLM's out-param ops (torch_binding.cpp); none returns a tensor, so the
fakes only validate what a trace can see (dtypes, devices, shapes), with messages that start
with the op name like the C++ checks. Each registration passes `add_op_namespace_prefix(...)`
directly (kernel-builder's registration check).
"""

from typing import Sequence

import torch

from ._ops import add_op_namespace_prefix

INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FP8 = torch.float8_e4m3fn


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
