"""Fake kernels, differentiable custom ops and autograd for the C++ rmsnorm ops (private).

The C++ library (torch_binding.cpp) defines out-param and in-place ops that return nothing:
`rms_norm`, `fused_add_rms_norm`, `gemma_rms_norm`, `gemma_fused_add_rms_norm`,
`rms_norm_modulate`, and the general `rms_norm_fwd` / `rms_norm_bwd` (semantics:
kernel_src/rmsnorm_params.h). This module adds:

* a fake kernel for each of them, so that torch.compile traces the out-param calls. The fakes
  check what the C++ layer checks (dtypes, devices, shapes, epsilon) with messages that start
  with the op name and name the argument, so bad calls fail at trace time too;
* three allocating custom ops over `rms_norm_fwd` / `rms_norm_bwd`, with fakes:
  `rms_norm_functional` (plain, Gemma and modulated forms), `add_rms_norm_functional` (fused
  residual add, out of place) and `rms_norm_bwd_functional`, the backward the autograd formulas
  call (opaque in compiled backward graphs too; it has no autograd formula itself, so double
  backward is not supported);
* `norm`, `add_norm` and the framework-shaped helpers (`llama_norm`, `gemma_norm`,
  `diffusers_norm`, `modulated_norm`) that pick the kernel's dtype options for each casting
  convention. `__init__.py` and `layers.py` call only these.

Shapes are symbolic-friendly (no Python branching on sizes), so compiled graphs do not
specialize on the number of tokens.
"""

import math
import struct
from typing import Optional, Tuple

import torch

from ._eager_path import OpRoutes
from ._ops import add_op_namespace_prefix, ops

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_HALF_DTYPES = (torch.float16, torch.bfloat16)


def _dtype_name(dtype: torch.dtype) -> str:
    """The dtype without the "torch." prefix, as the C++ messages print it."""
    return str(dtype).replace("torch.", "")


# ---- checks shared by the fakes (RuntimeError through torch._check, like the C++ layer) ----


def _check_input(op: str, x: torch.Tensor, arg: str = "input") -> None:
    torch._check(
        x.dtype in KERNEL_DTYPES,
        lambda: f"{op}: {arg} must be float32, float16 or bfloat16, got {_dtype_name(x.dtype)}",
    )
    torch._check(
        x.dim() >= 1,
        lambda: f"{op}: {arg} must have at least one dimension [..., hidden], got a 0-d tensor",
    )
    torch._check(
        x.shape[-1] != 0 or math.prod(x.shape[:-1]) == 0,
        lambda: (
            f"{op}: {arg} must have a last dimension (hidden) > 0 when it has rows, got shape {list(x.shape)}"
        ),
    )


def _check_device(op: str, arg: str, t: torch.Tensor, x: torch.Tensor) -> None:
    torch._check(
        t.device == x.device,
        lambda: f"{op}: {arg} must be on the device of input (expected {x.device}, got {t.device})",
    )


def _check_same(op: str, arg: str, t: torch.Tensor, x: torch.Tensor, dtypes=None) -> None:
    """`t` has the shape of input and its dtype (or one of `dtypes`), on its device."""
    allowed = (x.dtype,) if dtypes is None else dtypes
    torch._check(
        t.dtype in allowed,
        lambda: (
            f"{op}: {arg} must have dtype {' or '.join(_dtype_name(d) for d in allowed)}, got {_dtype_name(t.dtype)}"
        ),
    )
    _check_device(op, arg, t, x)
    torch._check(
        tuple(t.shape) == tuple(x.shape),
        lambda: (
            f"{op}: {arg} must have shape {list(x.shape)} (the input shape), got {list(t.shape)}"
        ),
    )


def _wide(x: torch.Tensor):
    """The dtypes a weight or an output may have for this input: its own, or float32."""
    return (x.dtype,) if x.dtype == torch.float32 else (x.dtype, torch.float32)


def _check_weight(op: str, arg: str, w: Optional[torch.Tensor], x: torch.Tensor) -> None:
    if w is None:
        return
    allowed = _wide(x)
    torch._check(
        w.dtype in allowed,
        lambda: (
            f"{op}: {arg} must have dtype {' or '.join(_dtype_name(d) for d in allowed)}, got {_dtype_name(w.dtype)}"
        ),
    )
    _check_device(op, arg, w, x)
    torch._check(
        w.dim() == 1 and w.shape[0] == x.shape[-1],
        lambda: (
            f"{op}: {arg} must have shape [{x.shape[-1]}] (the hidden size of input), got {list(w.shape)}"
        ),
    )


def _check_modulation(op: str, arg: str, t: Optional[torch.Tensor], x: torch.Tensor) -> None:
    if t is None:
        return
    torch._check(
        x.dim() >= 2,
        lambda: f"{op}: input must have shape [B, ..., hidden] with {arg}, got {list(x.shape)}",
    )
    torch._check(
        t.dtype == x.dtype,
        lambda: (
            f"{op}: {arg} must have dtype {_dtype_name(x.dtype)} (the input dtype), got {_dtype_name(t.dtype)}"
        ),
    )
    _check_device(op, arg, t, x)
    torch._check(
        (t.dim() == 2 or (t.dim() == 3 and t.shape[1] == 1))
        and t.shape[0] == x.shape[0]
        and t.shape[-1] == x.shape[-1],
        lambda: (
            f"{op}: {arg} must have shape [{x.shape[0]}, {x.shape[-1]}] or [{x.shape[0]}, 1, {x.shape[-1]}] "
            f"([B, hidden] for input [B, ..., hidden]), got {list(t.shape)}"
        ),
    )


def _float32(value: float) -> float:
    """`value` rounded to float32 (inf when out of its range); no tensor, so it runs in fakes."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.inf


def _check_eps(op: str, eps: float) -> None:
    # The kernels take eps as a float32: it must be finite and > 0 there too (1e-50 is not).
    eps32 = _float32(eps)
    torch._check(
        math.isfinite(eps32) and eps32 > 0.0,
        lambda: f"{op}: epsilon must be a finite number > 0 (in float32), got {eps}",
    )


def _check_offset(op: str, weight_offset: float) -> None:
    torch._check(
        math.isfinite(_float32(weight_offset)),
        lambda: f"{op}: weight_offset must be finite (in float32), got {weight_offset}",
    )


def _check_norm_dtype(op: str, norm_dtype: Optional[torch.dtype]) -> None:
    torch._check(
        norm_dtype is None or norm_dtype in KERNEL_DTYPES,
        lambda: f"{op}: norm_dtype must be float32, float16, bfloat16 or None, got {norm_dtype}",
    )


def _check_pair(op: str, a_name: str, a, b_name: str, b) -> None:
    torch._check(
        (a is None) == (b is None),
        lambda: f"{op}: {a_name} and {b_name} must be given together",
    )


def _check_fwd(
    op: str,
    out: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    residual: Optional[torch.Tensor],
    residual_out: Optional[torch.Tensor],
    scale: Optional[torch.Tensor],
    shift: Optional[torch.Tensor],
    rstd: Optional[torch.Tensor],
    eps: float,
    norm_dtype: Optional[torch.dtype],
    weight_offset: float = 0.0,
) -> None:
    _check_input(op, x)
    _check_same(op, "out", out, x, _wide(x))
    _check_weight(op, "weight", weight, x)
    _check_pair(op, "residual", residual, "residual_out", residual_out)
    if residual is not None:
        _check_same(op, "residual", residual, x)
        _check_same(op, "residual_out", residual_out, x)
    _check_pair(op, "scale", scale, "shift", shift)
    _check_modulation(op, "scale", scale, x)
    _check_modulation(op, "shift", shift, x)
    if rstd is not None:
        torch._check(
            rstd.dtype == torch.float32,
            lambda: f"{op}: rstd must have dtype float32, got {_dtype_name(rstd.dtype)}",
        )
        _check_device(op, "rstd", rstd, x)
        torch._check(
            tuple(rstd.shape) == tuple(x.shape[:-1]),
            lambda: (
                f"{op}: rstd must have shape {list(x.shape[:-1])} (the input shape without hidden), got {list(rstd.shape)}"
            ),
        )
    _check_eps(op, eps)
    _check_offset(op, weight_offset)
    _check_norm_dtype(op, norm_dtype)


def _check_bwd(
    op: str,
    grad_input: Optional[torch.Tensor],
    grad_weight: Optional[torch.Tensor],
    grad_scale: Optional[torch.Tensor],
    grad_shift: Optional[torch.Tensor],
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    grad_residual: Optional[torch.Tensor],
    scale: Optional[torch.Tensor],
    eps: float,
    norm_dtype: Optional[torch.dtype],
    weight_offset: float = 0.0,
) -> None:
    _check_input(op, x)
    if grad_input is not None:
        _check_same(op, "grad_input", grad_input, x)
    _check_same(op, "grad_out", grad_out, x, _wide(x))
    _check_weight(op, "weight", weight, x)
    if grad_residual is not None:
        _check_same(op, "grad_residual", grad_residual, x)
    _check_modulation(op, "scale", scale, x)
    if grad_weight is not None:
        torch._check(weight is not None, lambda: f"{op}: grad_weight needs weight")
        _check_weight(op, "grad_weight", grad_weight, x)
        torch._check(
            grad_weight.dtype == weight.dtype,
            lambda: (
                f"{op}: grad_weight must have the dtype of weight ({_dtype_name(weight.dtype)}), got {_dtype_name(grad_weight.dtype)}"
            ),
        )
    for name, g in (("grad_scale", grad_scale), ("grad_shift", grad_shift)):
        if g is not None:
            torch._check(
                scale is not None, lambda: f"{op}: {name} needs scale (a modulated forward)"
            )
            _check_modulation(op, name, g, x)
    _check_eps(op, eps)
    _check_offset(op, weight_offset)
    _check_norm_dtype(op, norm_dtype)


# ---- fakes of the C++ ops (they return nothing: validate only) ----


@torch.library.register_fake(add_op_namespace_prefix("rms_norm"))
def _rms_norm_fake(out, input, weight, epsilon, enable_pdl=None):
    _check_fwd("rms_norm", out, input, weight, None, None, None, None, None, epsilon, input.dtype)


@torch.library.register_fake(add_op_namespace_prefix("gemma_rms_norm"))
def _gemma_rms_norm_fake(out, input, weight, epsilon, enable_pdl=None):
    _check_fwd("gemma_rms_norm", out, input, weight, None, None, None, None, None, epsilon, None)


@torch.library.register_fake(add_op_namespace_prefix("fused_add_rms_norm"))
def _fused_add_rms_norm_fake(input, residual, weight, epsilon, enable_pdl=None):
    _check_fwd(
        "fused_add_rms_norm",
        input,
        input,
        weight,
        residual,
        residual,
        None,
        None,
        None,
        epsilon,
        input.dtype,
    )


@torch.library.register_fake(add_op_namespace_prefix("gemma_fused_add_rms_norm"))
def _gemma_fused_add_rms_norm_fake(input, residual, weight, epsilon, enable_pdl=None):
    _check_fwd(
        "gemma_fused_add_rms_norm",
        input,
        input,
        weight,
        residual,
        residual,
        None,
        None,
        None,
        epsilon,
        None,
    )


@torch.library.register_fake(add_op_namespace_prefix("rms_norm_modulate"))
def _rms_norm_modulate_fake(out, input, weight, scale, shift, epsilon, enable_pdl=None):
    _check_fwd(
        "rms_norm_modulate", out, input, weight, None, None, scale, shift, None, epsilon, None
    )


@torch.library.register_fake(add_op_namespace_prefix("rms_norm_fwd"))
def _rms_norm_fwd_fake(
    out,
    input,
    weight,
    residual,
    residual_out,
    scale,
    shift,
    rstd,
    epsilon,
    weight_offset,
    norm_dtype,
    enable_pdl=None,
):
    _check_fwd(
        "rms_norm_fwd",
        out,
        input,
        weight,
        residual,
        residual_out,
        scale,
        shift,
        rstd,
        epsilon,
        norm_dtype,
        weight_offset,
    )


@torch.library.register_fake(add_op_namespace_prefix("rms_norm_bwd"))
def _rms_norm_bwd_fake(
    grad_input,
    grad_weight,
    grad_scale,
    grad_shift,
    grad_out,
    input,
    weight,
    grad_residual,
    scale,
    epsilon,
    weight_offset,
    norm_dtype,
    enable_pdl=None,
):
    _check_bwd(
        "rms_norm_bwd",
        grad_input,
        grad_weight,
        grad_scale,
        grad_shift,
        grad_out,
        input,
        weight,
        grad_residual,
        scale,
        epsilon,
        norm_dtype,
        weight_offset,
    )


# ---- allocating custom ops ----


@torch.library.custom_op(
    add_op_namespace_prefix("rms_norm_functional"),
    mutates_args=(),
    schema="(Tensor input, Tensor? weight, Tensor? scale, Tensor? shift, float epsilon, float weight_offset, "
    "ScalarType? norm_dtype, ScalarType out_dtype, bool? enable_pdl=None) -> Tensor",
)
def _rms_norm_functional(
    input, weight, scale, shift, epsilon, weight_offset, norm_dtype, out_dtype, enable_pdl=None
):
    return _norm_allocating(
        input, weight, scale, shift, epsilon, weight_offset, norm_dtype, out_dtype, enable_pdl
    )


def _norm_allocating(
    input, weight, scale, shift, epsilon, weight_offset, norm_dtype, out_dtype, enable_pdl=None
):
    """The body of rms_norm_functional, also called directly by `norm` in eager inference."""
    out = torch.empty(input.shape, dtype=out_dtype, device=input.device)
    ops.rms_norm_fwd(
        out,
        input,
        weight,
        None,
        None,
        scale,
        shift,
        None,
        epsilon,
        weight_offset,
        norm_dtype,
        enable_pdl,
    )
    return out


@torch.library.register_fake(add_op_namespace_prefix("rms_norm_functional"))
def _rms_norm_functional_fake(
    input, weight, scale, shift, epsilon, weight_offset, norm_dtype, out_dtype, enable_pdl=None
):
    out = torch.empty(input.shape, dtype=out_dtype, device=input.device)
    _check_fwd(
        "rms_norm_functional",
        out,
        input,
        weight,
        None,
        None,
        scale,
        shift,
        None,
        epsilon,
        norm_dtype,
        weight_offset,
    )
    return out


@torch.library.custom_op(
    add_op_namespace_prefix("add_rms_norm_functional"),
    mutates_args=(),
    schema="(Tensor input, Tensor residual, Tensor? weight, float epsilon, float weight_offset, "
    "ScalarType? norm_dtype, ScalarType out_dtype, bool? enable_pdl=None) -> (Tensor, Tensor)",
)
def _add_rms_norm_functional(
    input, residual, weight, epsilon, weight_offset, norm_dtype, out_dtype, enable_pdl=None
):
    return _add_norm_allocating(
        input, residual, weight, epsilon, weight_offset, norm_dtype, out_dtype, enable_pdl
    )


def _add_norm_allocating(
    input, residual, weight, epsilon, weight_offset, norm_dtype, out_dtype, enable_pdl=None
):
    """The body of add_rms_norm_functional, also called directly by `add_norm` in eager inference."""
    out = torch.empty(input.shape, dtype=out_dtype, device=input.device)
    residual_out = torch.empty(input.shape, dtype=input.dtype, device=input.device)
    ops.rms_norm_fwd(
        out,
        input,
        weight,
        residual,
        residual_out,
        None,
        None,
        None,
        epsilon,
        weight_offset,
        norm_dtype,
        enable_pdl,
    )
    return out, residual_out


@torch.library.register_fake(add_op_namespace_prefix("add_rms_norm_functional"))
def _add_rms_norm_functional_fake(
    input, residual, weight, epsilon, weight_offset, norm_dtype, out_dtype, enable_pdl=None
):
    out = torch.empty(input.shape, dtype=out_dtype, device=input.device)
    residual_out = torch.empty(input.shape, dtype=input.dtype, device=input.device)
    _check_fwd(
        "add_rms_norm_functional",
        out,
        input,
        weight,
        residual,
        residual_out,
        None,
        None,
        None,
        epsilon,
        norm_dtype,
        weight_offset,
    )
    return out, residual_out


def _bwd_outputs(input, weight, scale, weight_grad, scale_grad, shift_grad):
    """Allocations of rms_norm_bwd_functional. grad_shift takes scale's shape: the autograd
    formula reshapes it to shift's ([B, D] and [B, 1, D] hold the same elements)."""

    def like(t, needed):
        return (
            torch.empty(t.shape, dtype=t.dtype, device=t.device)
            if needed and t is not None
            else None
        )

    grad_input = torch.empty(input.shape, dtype=input.dtype, device=input.device)
    return grad_input, like(weight, weight_grad), like(scale, scale_grad), like(scale, shift_grad)


def _norm_bwd_allocating(
    grad_out,
    input,
    weight,
    grad_residual,
    scale,
    epsilon,
    weight_offset,
    norm_dtype,
    weight_grad,
    scale_grad,
    shift_grad,
    enable_pdl=None,
):
    grads = _bwd_outputs(input, weight, scale, weight_grad, scale_grad, shift_grad)
    ops.rms_norm_bwd(
        *grads,
        grad_out,
        input,
        weight,
        grad_residual,
        scale,
        epsilon,
        weight_offset,
        norm_dtype,
        enable_pdl,
    )
    return grads


# The allocating backward op (what AOT autograd traces); eager autograd calls its body.
_rms_norm_bwd_functional = torch.library.custom_op(
    add_op_namespace_prefix("rms_norm_bwd_functional"),
    _norm_bwd_allocating,
    mutates_args=(),
    schema="(Tensor grad_out, Tensor input, Tensor? weight, Tensor? grad_residual, Tensor? scale, float epsilon, "
    "float weight_offset, ScalarType? norm_dtype, bool weight_grad, bool scale_grad, bool shift_grad, "
    "bool? enable_pdl=None) -> (Tensor, Tensor?, Tensor?, Tensor?)",
)


@torch.library.register_fake(add_op_namespace_prefix("rms_norm_bwd_functional"))
def _rms_norm_bwd_functional_fake(
    grad_out,
    input,
    weight,
    grad_residual,
    scale,
    epsilon,
    weight_offset,
    norm_dtype,
    weight_grad,
    scale_grad,
    shift_grad,
    enable_pdl=None,
):
    op = "rms_norm_bwd_functional"
    torch._check(not weight_grad or weight is not None, lambda: f"{op}: weight_grad needs weight")
    torch._check(
        not (scale_grad or shift_grad) or scale is not None,
        lambda: f"{op}: scale_grad and shift_grad need scale",
    )
    grads = _bwd_outputs(input, weight, scale, weight_grad, scale_grad, shift_grad)
    _check_bwd(
        op,
        *grads,
        grad_out,
        input,
        weight,
        grad_residual,
        scale,
        epsilon,
        norm_dtype,
        weight_offset,
    )
    return grads


# ---- autograd formulas (the kernel's backward; roundings pass gradients straight through) ----


def _norm_setup_context(ctx, inputs, output) -> None:
    input, weight, scale, shift, epsilon, weight_offset, norm_dtype, _, enable_pdl = inputs
    ctx.save_for_backward(input, weight, scale)
    ctx.options = (epsilon, weight_offset, norm_dtype)
    ctx.enable_pdl = enable_pdl  # the backward launches as the forward did
    ctx.shift_shape = None if shift is None else shift.shape


def _norm_backward_through(norm_bwd):
    """rms_norm_functional's backward formula, its gradients computed by `norm_bwd`: the backward
    op (what AOT autograd traces) or, in eager autograd, that op's body."""

    def backward(ctx, grad_out):
        input, weight, scale = ctx.saved_tensors
        need_input, need_weight, need_scale, need_shift = ctx.needs_input_grad[:4]
        grad_input, grad_weight, grad_scale, grad_shift = norm_bwd(
            grad_out,
            input,
            weight,
            None,
            scale,
            *ctx.options,
            need_weight,
            need_scale,
            need_shift,
            ctx.enable_pdl,
        )
        if grad_shift is not None:
            grad_shift = grad_shift.reshape(ctx.shift_shape)
        return (
            (grad_input if need_input else None),
            grad_weight,
            grad_scale,
            grad_shift,
            None,
            None,
            None,
            None,
            None,
        )

    return backward


_norm_routes = OpRoutes(
    "RmsNormEager",
    _rms_norm_functional,
    _norm_allocating,
    _norm_setup_context,
    _norm_backward_through,
    _rms_norm_bwd_functional,
    _norm_bwd_allocating,
)


def _add_norm_setup_context(ctx, inputs, output) -> None:
    _, _, weight, epsilon, weight_offset, norm_dtype, _, enable_pdl = inputs
    # The backward normalizes the rounded sum r = residual_out again (rstd is recomputed).
    ctx.save_for_backward(output[1], weight)
    ctx.options = (epsilon, weight_offset, norm_dtype)
    ctx.enable_pdl = enable_pdl


def _add_norm_backward_through(norm_bwd):
    """add_rms_norm_functional's backward formula, its gradients computed by `norm_bwd` (as in
    _norm_backward_through)."""

    def backward(ctx, grad_out, grad_residual_out):
        residual_out, weight = ctx.saved_tensors
        need_input, need_residual, need_weight = ctx.needs_input_grad[:3]
        if grad_out is None:  # only residual_out reached the loss
            grad_out = torch.zeros_like(residual_out)
        grad_r, grad_weight, _, _ = norm_bwd(
            grad_out,
            residual_out,
            weight,
            grad_residual_out,
            None,
            *ctx.options,
            need_weight,
            False,
            False,
            ctx.enable_pdl,
        )
        # d(x + residual)/dx = d(x + residual)/dresidual = 1: both receive the gradient of r.
        return (
            (grad_r if need_input else None),
            (grad_r if need_residual else None),
            grad_weight,
            None,
            None,
            None,
            None,
            None,
        )

    return backward


_add_norm_routes = OpRoutes(
    "AddRmsNormEager",
    _add_rms_norm_functional,
    _add_norm_allocating,
    _add_norm_setup_context,
    _add_norm_backward_through,
    _rms_norm_bwd_functional,
    _norm_bwd_allocating,
)


# ---- casting conventions -> kernel options ----


def kernel_weight(x: torch.Tensor, weight: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The weight as the kernel takes it (the input dtype or float32).

    A half-precision weight of the *other* half dtype (bf16 weight, fp16 input, or the reverse;
    or a half weight with an fp32 input) is widened to float32, which is exact, so that every
    dtype pair the frameworks accept can run. Other dtypes pass through for the op to reject.
    """
    if (
        weight is not None
        and weight.dtype != x.dtype
        and weight.dtype in _HALF_DTYPES
        and x.dtype in KERNEL_DTYPES
    ):
        return weight.to(torch.float32)
    return weight


def promoted_dtype(x: torch.Tensor, weight: Optional[torch.Tensor]) -> torch.dtype:
    """``promote_types(x, weight)`` over the kernel's dtypes (``weight * x`` in PyTorch); x's otherwise."""
    if weight is None or weight.dtype not in KERNEL_DTYPES or x.dtype not in KERNEL_DTYPES:
        return x.dtype
    return torch.promote_types(x.dtype, weight.dtype)


def norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    *,
    weight_offset: float = 0.0,
    norm_dtype: Optional[torch.dtype] = None,
    out_dtype: Optional[torch.dtype] = None,
    scale: Optional[torch.Tensor] = None,
    shift: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """Differentiable `rms_norm_fwd` with every option (weight already in a kernel dtype)."""
    return _norm_routes.pick(x, weight, scale, shift)(
        x,
        weight,
        scale,
        shift,
        float(eps),
        float(weight_offset),
        norm_dtype,
        x.dtype if out_dtype is None else out_dtype,
        enable_pdl,
    )


def add_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    *,
    weight_offset: float = 0.0,
    norm_dtype: Optional[torch.dtype] = None,
    out_dtype: Optional[torch.dtype] = None,
    enable_pdl: Optional[bool] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Differentiable fused residual add + norm: ``(norm(r), r)``, ``r = round(x + residual)``."""
    return _add_norm_routes.pick(x, residual, weight)(
        x,
        residual,
        weight,
        float(eps),
        float(weight_offset),
        norm_dtype,
        x.dtype if out_dtype is None else out_dtype,
        enable_pdl,
    )


def llama_norm(
    x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, enable_pdl: Optional[bool] = None
) -> torch.Tensor:
    """transformers LlamaRMSNorm: ``weight * round_x(x * rstd)`` in dtype promote(x, weight)."""
    return norm(
        x,
        kernel_weight(x, weight),
        eps,
        norm_dtype=x.dtype,
        out_dtype=promoted_dtype(x, weight),
        enable_pdl=enable_pdl,
    )


def gemma_norm(
    x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, enable_pdl: Optional[bool] = None
) -> torch.Tensor:
    """transformers GemmaRMSNorm: ``round_x(x * rstd * (1 + weight))``, fp32 throughout."""
    return norm(x, kernel_weight(x, weight), eps, weight_offset=1.0, enable_pdl=enable_pdl)


def diffusers_norm(
    x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float
) -> torch.Tensor:
    """diffusers RMSNorm, its casting rules exactly (see _reference.diffusers_rms_norm)."""
    if weight is None:
        # n rounded once to the input dtype.
        return norm(x, None, eps)
    if weight.dtype in _HALF_DTYPES and x.dtype in KERNEL_DTYPES:
        if weight.dtype == x.dtype:
            y = norm(x, weight, eps, norm_dtype=x.dtype)
        else:
            # diffusers rounds n to the *weight* dtype W and multiplies in W: round_W(round_W(n) * w).
            # The kernel takes a weight in the input dtype or fp32 only, so: weight widened to fp32
            # (exact), n rounded to W (norm_dtype), the product kept in fp32 and rounded to W here.
            # The product of two W values (at most 11 significant bits each) is exact in fp32, so
            # the single rounding to W below gives diffusers' result bit for bit.
            y = norm(
                x, weight.to(torch.float32), eps, norm_dtype=weight.dtype, out_dtype=torch.float32
            ).to(weight.dtype)
    else:
        # fp32 weight: n and the product stay in fp32; the result is fp32 whatever the input dtype.
        y = norm(x, weight, eps, out_dtype=promoted_dtype(x, weight))
    if bias is not None:
        y = y + bias
    return y


def modulated_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    scale: torch.Tensor,
    shift: torch.Tensor,
    eps: float,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """``round_x(x * rstd * weight * (1 + scale) + shift)``, fp32 throughout."""
    return norm(x, kernel_weight(x, weight), eps, scale=scale, shift=shift, enable_pdl=enable_pdl)
