"""Fake kernels, allocating custom ops and autograd for the C++ activation ops (private).

The C++ library defines out-param ops, `<op>(Tensor! out, Tensor input[, scalars], bool?
enable_pdl=None) -> ()`, and their backward, `<op>_bwd(Tensor! grad_input, Tensor grad_out, Tensor
input[, scalars], bool? enable_pdl=None) -> ()`. `enable_pdl` (programmatic dependent launch on
CUDA: None the kernel's default, True on, False off) is passed along like the scalars; the
allocating ops below take it too, as their last argument.
This module adds, for each of the 12 activations:

* a fake kernel for `<op>` and `<op>_bwd`, so that torch.compile can trace the out-param calls;
* `<op>_functional(Tensor input[, scalars]) -> Tensor`, a custom op that allocates the output
  and calls `<op>`, with a fake kernel and an autograd formula;
* `<op>_bwd_functional(Tensor grad_out, Tensor input[, scalars]) -> Tensor`, the allocating
  backward that the autograd formula calls, with a fake kernel, so that compiled backward
  graphs see an opaque op too. It has no autograd formula itself: double backward is not
  supported.

All fakes validate dtypes and shapes with messages that start with the op name. The ops are
generated from one table; each registration passes `add_op_namespace_prefix(...)` directly.
"""

from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

import torch

from ._eager_path import OpRoutes
from ._ops import add_op_namespace_prefix, ops

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _dtype_name(dtype: torch.dtype) -> str:
    """The dtype without the "torch." prefix, as the C++ messages print it."""
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class _OpSpec:
    name: str
    gated: bool
    # Schema fragment of the scalar parameters (defaults as in the C++ schemas).
    scalars: str = ""

    @property
    def num_scalars(self) -> int:
        return self.scalars.count("float ")


_SPECS = (
    _OpSpec("silu_and_mul", gated=True),
    _OpSpec("mul_and_silu", gated=True),
    _OpSpec("gelu_and_mul", gated=True),
    _OpSpec("gelu_tanh_and_mul", gated=True),
    _OpSpec("fatrelu_and_mul", gated=True, scalars=", float threshold=0.0"),
    _OpSpec("swigluoai_and_mul", gated=True, scalars=", float alpha=1.702, float limit=7.0"),
    _OpSpec("gelu", gated=False),
    _OpSpec("gelu_tanh", gated=False),
    _OpSpec("silu", gated=False),
    _OpSpec("gelu_fast", gated=False),
    _OpSpec("gelu_new", gated=False),
    _OpSpec("gelu_quick", gated=False),
)

#: How each activation runs, called as (input, *scalars, enable_pdl): its allocating,
#: differentiable custom op, the op's body (a new output filled by the out-param op), and the
#: body under the op's autograd formula (_eager_path.OpRoutes).
ROUTES: Dict[str, OpRoutes] = {}


def activate(name: str, x: torch.Tensor, *scalars_and_pdl) -> torch.Tensor:
    """The activation `name` of x, through the route the call needs (ROUTES)."""
    return ROUTES[name].pick(x)(x, *scalars_and_pdl)


# ---- shape rules and checks shared by the fakes ----


def output_shape(name: str, gated: bool, x: torch.Tensor) -> Tuple[int, ...]:
    """Shape of `<name>(x)`: x's shape, with the last dimension halved for gated ops."""
    if not gated:
        return tuple(x.shape)
    torch._check(
        x.dim() >= 1, lambda: f"{name}: input must have at least one dimension, got a 0-d tensor"
    )
    torch._check(
        x.shape[-1] % 2 == 0,
        lambda: f"{name}: input last dimension must be even (2 * d), got {x.shape[-1]}",
    )
    return (*x.shape[:-1], x.shape[-1] // 2)


def _check_dtype(name: str, arg: str, t: torch.Tensor) -> None:
    torch._check(
        t.dtype in _FLOAT_DTYPES,
        lambda: (
            f"{name}: {arg} must be float32, float16, bfloat16 or float64, got {_dtype_name(t.dtype)}"
        ),
    )


def _check_like(name: str, arg: str, t: torch.Tensor, ref_arg: str, ref: torch.Tensor) -> None:
    torch._check(
        t.dtype == ref.dtype,
        lambda: (
            f"{name}: {arg} must have the dtype of {ref_arg} (expected {_dtype_name(ref.dtype)}, got {_dtype_name(t.dtype)})"
        ),
    )
    torch._check(
        t.device == ref.device,
        lambda: (
            f"{name}: {arg} must be on the device of {ref_arg} (expected {ref.device}, got {t.device})"
        ),
    )


def _check_shape(name: str, arg: str, t: torch.Tensor, expected: Sequence[int], what: str) -> None:
    torch._check(
        tuple(t.shape) == tuple(expected),
        lambda: f"{name}: {arg} must have shape {list(expected)} ({what}), got {list(t.shape)}",
    )


def _check_fwd(name: str, gated: bool, x: torch.Tensor) -> Tuple[int, ...]:
    _check_dtype(name, "input", x)
    return output_shape(name, gated, x)


def _check_bwd(name: str, gated: bool, grad_out: torch.Tensor, x: torch.Tensor) -> None:
    _check_dtype(name, "input", x)
    _check_like(name, "grad_out", grad_out, "input", x)
    what = "the input shape with the last dimension halved" if gated else "the input shape"
    _check_shape(name, "grad_out", grad_out, output_shape(name, gated, x), what)


# ---- generated registrations ----


def _register(spec: _OpSpec) -> None:
    name, gated = spec.name, spec.gated
    bwd_name = f"{name}_bwd"
    out_op = getattr(ops, name)
    bwd_op = getattr(ops, bwd_name)

    # Fakes of the C++ out-param ops: validate, then nothing to return.
    def out_fake(out: torch.Tensor, x: torch.Tensor, *scalars: float) -> None:
        shape = _check_fwd(name, gated, x)
        _check_like(name, "out", out, "input", x)
        what = "the input shape with the last dimension halved" if gated else "the input shape"
        _check_shape(name, "out", out, shape, what)

    def bwd_fake(
        grad_input: torch.Tensor, grad_out: torch.Tensor, x: torch.Tensor, *scalars: float
    ) -> None:
        _check_bwd(bwd_name, gated, grad_out, x)
        _check_like(bwd_name, "grad_input", grad_input, "input", x)
        _check_shape(bwd_name, "grad_input", grad_input, x.shape, "the input shape")

    torch.library.register_fake(add_op_namespace_prefix(name), out_fake)
    torch.library.register_fake(add_op_namespace_prefix(bwd_name), bwd_fake)

    # Allocating forward: a fresh contiguous output, filled by the out-param op. Under dynamo
    # (compiled inference traces this body) the checks are the out-param op's fake's: dynamo
    # cannot trace torch._check messages that read tensors.
    def forward(x: torch.Tensor, *scalars: float) -> torch.Tensor:
        if torch.compiler.is_compiling() and (not gated or x.dim() >= 1):
            shape = (*x.shape[:-1], x.shape[-1] // 2) if gated else x.shape
        else:
            shape = _check_fwd(name, gated, x)
        out = x.new_empty(shape)
        out_op(out, x, *scalars)
        return out

    def forward_fake(x: torch.Tensor, *scalars: float) -> torch.Tensor:
        return x.new_empty(_check_fwd(name, gated, x))

    # Allocating backward: grad_input is contiguous with the input's shape.
    def backward(grad_out: torch.Tensor, x: torch.Tensor, *scalars: float) -> torch.Tensor:
        _check_bwd(bwd_name, gated, grad_out, x)
        grad_input = x.new_empty(x.shape)
        bwd_op(grad_input, grad_out, x, *scalars)
        return grad_input

    def backward_fake(grad_out: torch.Tensor, x: torch.Tensor, *scalars: float) -> torch.Tensor:
        _check_bwd(bwd_name, gated, grad_out, x)
        return x.new_empty(x.shape)

    forward_op = torch.library.custom_op(
        add_op_namespace_prefix(f"{name}_functional"),
        forward,
        mutates_args=(),
        schema=f"(Tensor input{spec.scalars}, bool? enable_pdl=None) -> Tensor",
    )
    torch.library.register_fake(add_op_namespace_prefix(f"{name}_functional"), forward_fake)

    backward_op = torch.library.custom_op(
        add_op_namespace_prefix(f"{bwd_name}_functional"),
        backward,
        mutates_args=(),
        schema=f"(Tensor grad_out, Tensor input{spec.scalars}, bool? enable_pdl=None) -> Tensor",
    )
    torch.library.register_fake(add_op_namespace_prefix(f"{bwd_name}_functional"), backward_fake)

    num_scalars = spec.num_scalars + 1  # and enable_pdl

    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(inputs[0])
        ctx.scalars = tuple(inputs[1:])

    def backward_through(grad_input_of):
        """The autograd formula, grad_input computed by `grad_input_of`: the backward op (what
        AOT autograd traces) or, in eager autograd, that op's body."""

        def autograd_backward(ctx, grad_out: torch.Tensor):
            (x,) = ctx.saved_tensors
            # The scalars and enable_pdl are hyperparameters, not differentiable inputs; the
            # backward launches with the forward's enable_pdl.
            return (grad_input_of(grad_out, x, *ctx.scalars),) + (None,) * num_scalars

        return autograd_backward

    eager_name = "".join(part.title() for part in name.split("_")) + "Eager"
    ROUTES[name] = OpRoutes(
        eager_name,
        forward_op,
        forward,
        setup_context,
        backward_through,
        backward_op,
        backward,
    )


for _spec in _SPECS:
    _register(_spec)
