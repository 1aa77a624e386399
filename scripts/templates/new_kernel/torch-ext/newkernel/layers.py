"""``kernelize`` layers: drop-in forwards for the host modules of models.

A layer follows the kernels layer rules: no ``__init__``, no members besides ``forward`` and the
two flags, and the host module's state declared by annotation (``Scale.alpha``), read from the
module the forward is bound to. ``forward`` goes through the differentiable custom op, so the
layers work in TRAINING mode and under torch.compile; the flags say so.
"""

import torch
import torch.nn as nn

from ._custom_ops import scale_functional


class Scale(nn.Module):
    """``alpha * x``; reads ``alpha`` from the host module."""

    alpha: float
    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scale_functional(x, float(self.alpha))
