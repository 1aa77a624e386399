"""newkernel: describe the kernel here (this docstring is its API reference).

The scaffold's example op, to replace with yours: ``scale(x, alpha=1.0, out=None)`` returns
``alpha * x``.

* ``scale(x, alpha)`` allocates the result: differentiable, and traceable by torch.compile (a
  fake kernel and an autograd formula are registered).
* ``scale(x, alpha, out=out)`` writes ``out`` (its last dimension needs stride 1) and returns it:
  the fast path, which calls the C++ op directly and is **not** seen by autograd.

``x`` is float32, float16, bfloat16 (fp32 math, each result rounded once) or float64, of any
shape and strides. ``alpha`` is rounded to float32; it gets no gradient.
"""

from typing import Optional

import torch

from . import _custom_ops, _reference, layers
from ._ops import add_op_namespace_prefix, ops

__all__ = ["scale", "layers"]


def scale(x: torch.Tensor, alpha: float = 1.0, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``alpha * x``, into ``out`` when given (not differentiable), else a new tensor."""
    if out is None:
        return _custom_ops.scale_functional(x, float(alpha))
    ops.scale(out, x, float(alpha))
    return out


# An error raised through a public function names it, not the op it reached (_public_errors.py).
from . import _public_errors  # noqa: E402

_public_errors.wrap_public([globals()], __all__, add_op_namespace_prefix)
_public_errors.wrap_layers(layers, add_op_namespace_prefix)
