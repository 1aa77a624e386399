"""`kernelize` layers: a drop-in forward for transformers' ``rotary_pos_emb`` hook.

transformers decorates its ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` functions
with ``@use_kernel_forward_from_hub("rotary_pos_emb")`` (kernels turns the function into a
module) and attaches them to the attention classes with ``@use_kernelized_func``; ``kernelize``
then replaces that module's forward with the layer's. kernels 0.17 requires the layer's forward
to have the same number and kinds of parameters as the function it replaces, so the forward is
``(self, q, k, cos, sin, unsqueeze_dim=1)`` exactly (the name ``apply_rotary_transformers`` is
the one kernels-community's ``rotary`` uses, so existing mappings only change the repo id).

The layer follows the kernels layer rules (no ``__init__``, no members besides ``forward`` and
the two flags) and goes through the differentiable custom op, so it works in TRAINING mode and
under torch.compile (fullgraph, no recompilation across sequence lengths); the flags say so.
"""

from typing import Tuple

import torch
import torch.nn as nn

from . import _custom_ops


class apply_rotary_transformers(nn.Module):  # noqa: N801 (the name transformers' mappings use)
    """transformers ``apply_rotary_pos_emb``: ``q * cos + rotate_half(q) * sin`` with the full
    cos/sin, fp32 math, one rounding; partial rotary when cos has fewer channels than q. See
    the package's ``apply_rotary_transformers``."""

    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        unsqueeze_dim: int = 1,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        return _custom_ops.transformers_rope(q, k, cos, sin, unsqueeze_dim)
