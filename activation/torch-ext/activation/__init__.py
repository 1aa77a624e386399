"""Activation kernels: gated (SwiGLU/GeGLU-style) and elementwise activations, forward and backward.

A drop-in superset of kernels-community/activation v1. Every function accepts three calling
conventions:

* ``silu_and_mul(out, x)``: the kernels-community form. Writes ``out`` (its last dimension
  needs stride 1) and returns it. This is the fast path: it calls the C++ op directly and is
  **not differentiable** (autograd does not see the write).
* ``silu_and_mul(x)`` or ``silu_and_mul(x=x)``: the functional form (sgl-kernel style). A single
  tensor is the input; a new output is allocated and returned. Differentiable, and traceable by
  torch.compile (fake kernels and autograd formulas are registered).
* ``silu_and_mul(None, x)``: the same as the functional form.

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

from . import _custom_ops, _reference, layers
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
]


def _resolve(
    name: str, out: Optional[torch.Tensor], x: Optional[torch.Tensor]
) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
    """Maps the calling conventions onto (out or None, input)."""
    if x is None:
        if out is None:
            raise TypeError(
                f"{name}() needs an input tensor: call {name}(x), {name}(out, x) or {name}(x=x)"
            )
        return None, out  # a single tensor is the input
    return out, x


def _apply(
    name: str,
    out: Optional[torch.Tensor],
    x: Optional[torch.Tensor],
    *scalars: float,
    enable_pdl: Optional[bool],
) -> torch.Tensor:
    out, x = _resolve(name, out, x)
    if out is None:
        return _custom_ops.FORWARD[name](x, *scalars, enable_pdl)
    getattr(ops, name)(out, x, *scalars, enable_pdl)
    return out


# ---- gated activations: x is [..., 2 * d], the result [..., d] ----


def silu_and_mul(
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    *,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """SwiGLU: ``silu(x[..., :d]) * x[..., d:]``."""
    return _apply("silu_and_mul", out, x, enable_pdl=enable_pdl)


def mul_and_silu(
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    *,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """``x[..., :d] * silu(x[..., d:])``."""
    return _apply("mul_and_silu", out, x, enable_pdl=enable_pdl)


def gelu_and_mul(
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    *,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """GeGLU: ``gelu(x[..., :d]) * x[..., d:]`` with the exact (erf) GELU."""
    return _apply("gelu_and_mul", out, x, enable_pdl=enable_pdl)


def gelu_tanh_and_mul(
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    *,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """``gelu_tanh(x[..., :d]) * x[..., d:]`` with the tanh-approximated GELU."""
    return _apply("gelu_tanh_and_mul", out, x, enable_pdl=enable_pdl)


def fatrelu_and_mul(
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    threshold: float = 0.0,
    *,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """FATReLU (MiniCPM-S): ``where(x1 > threshold, x1, 0) * x2`` with ``x1, x2 = x[..., :d], x[..., d:]``.

    ``threshold`` is rounded to float32. Its gradient is not computed.
    """
    return _apply("fatrelu_and_mul", out, x, float(threshold), enable_pdl=enable_pdl)


def swigluoai_and_mul(
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    alpha: float = 1.702,
    limit: float = 7.0,
    *,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """gpt-oss SwiGLU (vLLM ``swigluoai_and_mul``) on interleaved gate/up columns.

    With ``gate = min(x[..., 0::2], limit)`` and ``up = clamp(x[..., 1::2], -limit, limit)``:
    ``(up + 1) * gate * sigmoid(alpha * gate)``. ``alpha`` and ``limit`` are rounded to float32;
    their gradients are not computed.
    """
    return _apply("swigluoai_and_mul", out, x, float(alpha), float(limit), enable_pdl=enable_pdl)


# ---- elementwise activations: the result has the shape of x ----


def gelu(
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    *,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """Exact GELU, ``0.5 * x * (1 + erf(x / sqrt(2)))`` (``F.gelu``)."""
    return _apply("gelu", out, x, enable_pdl=enable_pdl)


def gelu_tanh(
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    *,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """Tanh GELU, ``F.gelu(x, approximate="tanh")``."""
    return _apply("gelu_tanh", out, x, enable_pdl=enable_pdl)


def silu(
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    *,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """SiLU / swish, ``x * sigmoid(x)`` (``F.silu``)."""
    return _apply("silu", out, x, enable_pdl=enable_pdl)


def gelu_fast(
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    *,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """``0.5 * x * (1 + tanh(0.7978845608 * x * (1 + 0.044715 * x**2)))`` (transformers FastGELU)."""
    return _apply("gelu_fast", out, x, enable_pdl=enable_pdl)


def gelu_new(
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    *,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """GPT-2 GELU, ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))`` (transformers NewGELU)."""
    return _apply("gelu_new", out, x, enable_pdl=enable_pdl)


def gelu_quick(
    out: Optional[torch.Tensor] = None,
    x: Optional[torch.Tensor] = None,
    *,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """Quick GELU, ``x * sigmoid(1.702 * x)`` (transformers QuickGELU)."""
    return _apply("gelu_quick", out, x, enable_pdl=enable_pdl)


# An error raised through a public function names it, not the op it reached (_public_errors.py).
from . import _public_errors  # noqa: E402

_public_errors.wrap_public([globals()], __all__, add_op_namespace_prefix)
