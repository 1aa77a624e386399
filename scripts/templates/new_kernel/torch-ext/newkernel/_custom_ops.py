"""Fake kernels, the allocating custom op and autograd of the C++ newkernel ops (private).

The C++ library defines the out-param op ``scale(Tensor! out, Tensor input, float alpha=1.0)
-> ()``. This module adds its fake kernel, so that torch.compile can trace calls with ``out``,
and ``scale_functional(Tensor input, float alpha=1.0) -> Tensor``, a custom op that allocates the
output, with a fake kernel and an autograd formula. The fakes check what the C++ layer checks,
with the same messages, so an error at trace time reads like the eager one.
"""

import torch

from ._ops import add_op_namespace_prefix, ops

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _check_input(op: str, x: torch.Tensor) -> None:
    torch._check(
        x.dtype in _FLOAT_DTYPES,
        lambda: (
            f"{op}: input must be float32, float16, bfloat16 or float64, got {_dtype_name(x.dtype)}"
        ),
    )


@torch.library.register_fake(add_op_namespace_prefix("scale"))
def _scale_fake(out: torch.Tensor, input: torch.Tensor, alpha: float = 1.0) -> None:
    _check_input("scale", input)
    torch._check(
        out.dtype == input.dtype,
        lambda: (
            f"scale: out must have the dtype of input (expected {_dtype_name(input.dtype)}, got {_dtype_name(out.dtype)})"
        ),
    )
    torch._check(
        out.device == input.device,
        lambda: (
            f"scale: out must be on the device of input (expected {input.device}, got {out.device})"
        ),
    )
    torch._check(
        out.shape == input.shape,
        lambda: (
            f"scale: out must have shape {list(input.shape)} (the input shape), got {list(out.shape)}"
        ),
    )


@torch.library.custom_op(add_op_namespace_prefix("scale_functional"), mutates_args=())
def scale_functional(input: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    out = torch.empty_like(input, memory_format=torch.contiguous_format)
    ops.scale(out, input, alpha)
    return out


@torch.library.register_fake(add_op_namespace_prefix("scale_functional"))
def _scale_functional_fake(input: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    _check_input("scale", input)
    return torch.empty_like(input, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output) -> None:
    ctx.alpha = inputs[1]


def _backward(ctx, grad_out: torch.Tensor):
    # d(alpha * x)/dx = alpha: the same op again (so double backward works too); alpha is a
    # hyperparameter and gets no gradient.
    return scale_functional(grad_out, ctx.alpha), None


torch.library.register_autograd(
    add_op_namespace_prefix("scale_functional"), _backward, setup_context=_setup_context
)
