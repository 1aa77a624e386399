"""Activation kernels: gated (SwiGLU/GeGLU-style) and elementwise activations, forward and backward.

A drop-in superset of kernels-community/activation v1. Every function accepts these calling
conventions:

* ``silu_and_mul(out, x)``: the kernels-community form. Writes ``out`` (its last dimension
  needs stride 1) and returns it. This is the fast path: it calls the C++ op directly and is
  **not differentiable** (autograd does not see the write). ``silu_and_mul(out, x=x)`` too.
* ``silu_and_mul(x, out=out)`` (also ``input=x``): sgl-kernel / FlashInfer's
  ``silu_and_mul(input, out=None)`` with the output passed by keyword; the same fast path.
  Their positional ``(input, out)`` cannot be told apart from kernels-community's ``(out, x)``
  in general (two tensors; for the elementwise ops of one shape), so two positional tensors are
  always read as ``(out, x)``; a gated call whose shapes show the other order (first
  ``[..., 2 * d]``, second ``[..., d]``) raises a ValueError naming the keyword form.
* ``silu_and_mul(x)``, ``silu_and_mul(x=x)`` or ``silu_and_mul(None, x)`` (``out`` None): the
  functional form. A new output is allocated and returned. Differentiable, and traceable by
  torch.compile (fake kernels and autograd formulas are registered).

Every function also takes ``enable_pdl: Optional[bool] = None`` (keyword): programmatic dependent
launch on CUDA (sm_90+). None keeps the kernel's measured default (off: after a kernel that does
not release its dependents, such as a GEMM, PDL was slower), True turns it on (for a call that
follows a kernel of this repository), False off. Ignored on CPU.

Gated ops read ``x`` of shape ``[..., 2 * d]`` and return ``[..., d]``; elementwise ops keep the
shape. Supported dtypes: float32, float16, bfloat16 (fp32 math, each result rounded once) and
float64. The input may have any strides. Double backward is not supported.
"""

from typing import Optional, Tuple

import torch

from . import _custom_ops, _hub_layers, _reference, layers
from ._ops import add_op_namespace_prefix, ops

__all__ = [
    "silu_and_mul",
    "mul_and_silu",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "fatrelu_and_mul",
    "swigluoai_and_mul",
    "gelu",
    "gelu_tanh",
    "silu",
    "gelu_fast",
    "gelu_new",
    "gelu_quick",
    "layers",
    "attach_layers",
]


_GATED = (
    "silu_and_mul",
    "mul_and_silu",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "fatrelu_and_mul",
    "swigluoai_and_mul",
)


def _resolve(
    name: str,
    first: Optional[torch.Tensor],
    second: Optional[torch.Tensor],
    out: Optional[torch.Tensor],
    x: Optional[torch.Tensor],
    input: Optional[torch.Tensor],
) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
    """Maps the calling conventions onto (out or None, input).

    Positional ``(out, x)`` is kernels-community's order; a single positional tensor is the
    input, with the output (if any) as the keyword ``out`` (sgl-kernel / FlashInfer); ``x`` and
    ``input`` are keyword names of the input.
    """
    if x is not None and input is not None:
        raise TypeError(f"{name}() got the input twice: pass x= or input=, not both")
    given = x if x is not None else input
    if second is not None:  # (out, x) or (None, x): kernels-community's positional order
        if out is not None or given is not None:
            raise TypeError(
                f"{name}() got two positional tensors (out, x) and out= / x= / input= as well"
            )
        return first, second
    if first is not None:
        if given is not None:  # (out, x=x)
            if out is not None:
                raise TypeError(f"{name}() got out twice (positionally and as out=)")
            return first, given
        return out, first  # (x) or (x, out=y)
    if given is None:
        raise TypeError(
            f"{name}() needs an input tensor: call {name}(x), {name}(out, x), {name}(x, out=out) "
            f"or {name}(x=x)"
        )
    return out, given


def _apply(
    name: str,
    first: Optional[torch.Tensor],
    second: Optional[torch.Tensor],
    out: Optional[torch.Tensor],
    x: Optional[torch.Tensor],
    input: Optional[torch.Tensor],
    *scalars: float,
    enable_pdl: Optional[bool],
) -> torch.Tensor:
    out, x = _resolve(name, first, second, out, x, input)
    if out is None:
        return _custom_ops.activate(name, x, *scalars, enable_pdl)
    if (
        second is not None
        and name in _GATED
        and out.dim() == x.dim()
        and out.dim() > 0
        and out.shape[-1] == 2 * x.shape[-1]
        and out.shape[-1] > 0
    ):
        raise ValueError(
            f"{name}(out, x): the first positional tensor is the output [..., d] and the second "
            f"the input [..., 2 * d] (kernels-community's order); got shapes {list(out.shape)} "
            f"and {list(x.shape)}, the sgl-kernel / FlashInfer order (input, out): pass the "
            f"output by keyword, {name}(x, out=out)"
        )
    getattr(ops, name)(out, x, *scalars, enable_pdl)
    return out


# ---- gated activations: x is [..., 2 * d], the result [..., d] ----


def silu_and_mul(
    first: Optional[torch.Tensor] = None,
    second: Optional[torch.Tensor] = None,
    /,
    *,
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    input: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """SwiGLU: ``silu(x[..., :d]) * x[..., d:]``."""
    return _apply("silu_and_mul", first, second, out, x, input, enable_pdl=enable_pdl)


def mul_and_silu(
    first: Optional[torch.Tensor] = None,
    second: Optional[torch.Tensor] = None,
    /,
    *,
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    input: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """``x[..., :d] * silu(x[..., d:])``."""
    return _apply("mul_and_silu", first, second, out, x, input, enable_pdl=enable_pdl)


def gelu_and_mul(
    first: Optional[torch.Tensor] = None,
    second: Optional[torch.Tensor] = None,
    /,
    *,
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    input: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """GeGLU: ``gelu(x[..., :d]) * x[..., d:]`` with the exact (erf) GELU."""
    return _apply("gelu_and_mul", first, second, out, x, input, enable_pdl=enable_pdl)


def gelu_tanh_and_mul(
    first: Optional[torch.Tensor] = None,
    second: Optional[torch.Tensor] = None,
    /,
    *,
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    input: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """``gelu_tanh(x[..., :d]) * x[..., d:]`` with the tanh-approximated GELU."""
    return _apply("gelu_tanh_and_mul", first, second, out, x, input, enable_pdl=enable_pdl)


def fatrelu_and_mul(
    first: Optional[torch.Tensor] = None,
    second: Optional[torch.Tensor] = None,
    /,
    threshold: float = 0.0,
    *,
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    input: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """FATReLU (MiniCPM-S): ``where(x1 > threshold, x1, 0) * x2`` with ``x1, x2 = x[..., :d], x[..., d:]``.

    ``threshold`` is rounded to float32. Its gradient is not computed.
    """
    return _apply(
        "fatrelu_and_mul", first, second, out, x, input, float(threshold), enable_pdl=enable_pdl
    )


def swigluoai_and_mul(
    first: Optional[torch.Tensor] = None,
    second: Optional[torch.Tensor] = None,
    /,
    alpha: float = 1.702,
    limit: float = 7.0,
    *,
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    input: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """gpt-oss SwiGLU (vLLM ``swigluoai_and_mul``) on interleaved gate/up columns.

    With ``gate = min(x[..., 0::2], limit)`` and ``up = clamp(x[..., 1::2], -limit, limit)``:
    ``(up + 1) * gate * sigmoid(alpha * gate)``. ``alpha`` and ``limit`` are rounded to float32;
    their gradients are not computed.
    """
    return _apply(
        "swigluoai_and_mul",
        first,
        second,
        out,
        x,
        input,
        float(alpha),
        float(limit),
        enable_pdl=enable_pdl,
    )


# ---- elementwise activations: the result has the shape of x ----


def gelu(
    first: Optional[torch.Tensor] = None,
    second: Optional[torch.Tensor] = None,
    /,
    *,
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    input: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """Exact GELU, ``0.5 * x * (1 + erf(x / sqrt(2)))`` (``F.gelu``)."""
    return _apply("gelu", first, second, out, x, input, enable_pdl=enable_pdl)


def gelu_tanh(
    first: Optional[torch.Tensor] = None,
    second: Optional[torch.Tensor] = None,
    /,
    *,
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    input: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """Tanh GELU, ``F.gelu(x, approximate="tanh")``."""
    return _apply("gelu_tanh", first, second, out, x, input, enable_pdl=enable_pdl)


def silu(
    first: Optional[torch.Tensor] = None,
    second: Optional[torch.Tensor] = None,
    /,
    *,
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    input: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """SiLU / swish, ``x * sigmoid(x)`` (``F.silu``)."""
    return _apply("silu", first, second, out, x, input, enable_pdl=enable_pdl)


def gelu_fast(
    first: Optional[torch.Tensor] = None,
    second: Optional[torch.Tensor] = None,
    /,
    *,
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    input: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """``0.5 * x * (1 + tanh(0.7978845608 * x * (1 + 0.044715 * x**2)))`` (transformers FastGELU)."""
    return _apply("gelu_fast", first, second, out, x, input, enable_pdl=enable_pdl)


def gelu_new(
    first: Optional[torch.Tensor] = None,
    second: Optional[torch.Tensor] = None,
    /,
    *,
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    input: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """GPT-2 GELU, ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))`` (transformers NewGELU)."""
    return _apply("gelu_new", first, second, out, x, input, enable_pdl=enable_pdl)


def gelu_quick(
    first: Optional[torch.Tensor] = None,
    second: Optional[torch.Tensor] = None,
    /,
    *,
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    input: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """Quick GELU, ``x * sigmoid(1.702 * x)`` (transformers QuickGELU)."""
    return _apply("gelu_quick", first, second, out, x, input, enable_pdl=enable_pdl)


# ---- attaching the kernelize layers to a model ----


attach_layers = _hub_layers.entry_point(
    __name__,
    layers,
    add_op_namespace_prefix,
    """Give the activation modules of a transformers / diffusers / PyTorch model our layers'
    forwards, by host class; returns ``{host class: modules replaced}``.

    Default host classes (``classes=None``; the map is ``layers.HOST_CLASSES``): transformers'
    ``SiLUActivation`` (Llama, Qwen, Mistral MLPs) -> ``Silu``, ``GELUActivation`` -> ``Gelu``,
    ``GELUTanh`` -> ``GeluTanh``, ``NewGELUActivation``, ``FastGELUActivation``,
    ``QuickGELUActivation`` -> ``NewGELU``, ``FastGELU``, ``QuickGELU``; ``torch.nn.SiLU`` (not
    in place) -> ``Silu``; diffusers' ``GELU`` (both ``approximate``), ``SwiGLU`` and
    ``ApproximateGELU`` -> ``DiffusersGELU``, ``DiffusersSwiGLU``, ``DiffusersApproximateGELU``
    (their projection, then our kernel). diffusers' ``GEGLU`` (``h * gelu(gate)``) has no
    kernel here and is not covered.
    """,
)


# An error raised through a public function names it, not the op it reached (_public_errors.py).
from . import _public_errors  # noqa: E402

_public_errors.wrap_public([globals()], __all__, add_op_namespace_prefix)
_public_errors.wrap_layers(layers, add_op_namespace_prefix)
