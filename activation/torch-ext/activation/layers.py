"""`kernelize` layers: drop-in forwards for activation modules.

Each layer follows the kernels layer rules: no ``__init__``, no members besides ``forward`` and
the two flags, and host-module state declared by annotation (``FatreluAndMul.threshold``,
``SwigluOAIAndMul.alpha`` / ``.limit``), read from the module the forward is bound to.
``FatreluAndMul(threshold)`` also constructs a standalone module (kernels-community's
constructor) through a metaclass, which leaves the class itself as the rules want it.
``forward`` allocates its output through the differentiable custom ops, so the layers work in
TRAINING mode and under torch.compile; the flags say so.
"""

from typing import Dict

import torch
import torch.nn as nn

from ._custom_ops import activate


class SiluAndMul(nn.Module):
    """``silu(x[..., :d]) * x[..., d:]``."""

    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return activate("silu_and_mul", x)


class MulAndSilu(nn.Module):
    """``x[..., :d] * silu(x[..., d:])``."""

    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return activate("mul_and_silu", x)


class GeluAndMul(nn.Module):
    """``gelu(x[..., :d]) * x[..., d:]`` (exact GELU)."""

    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return activate("gelu_and_mul", x)


class GeluTanhAndMul(nn.Module):
    """``gelu_tanh(x[..., :d]) * x[..., d:]``."""

    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return activate("gelu_tanh_and_mul", x)


class _ThresholdConstructor(type(nn.Module)):
    """Lets ``FatreluAndMul(threshold=0.0)`` build a standalone module, as kernels-community's
    constructor does, while the class keeps nn.Module's own ``__init__`` and no members besides
    ``forward`` and the flags (kernels' layer validation rejects both). The metaclass's
    ``__call__`` is not a member of the class (``inspect.getmembers`` does not list it)."""

    def __call__(cls, threshold: float = 0.0):
        module = super().__call__()
        module.threshold = threshold
        return module


class FatreluAndMul(nn.Module, metaclass=_ThresholdConstructor):
    """``where(x1 > threshold, x1, 0) * x2``; reads ``threshold`` from the host module.

    Standalone, ``FatreluAndMul(threshold=0.0)`` as in kernels-community (default 0.0).
    """

    threshold: float
    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return activate("fatrelu_and_mul", x, float(self.threshold))


class SwigluOAIAndMul(nn.Module):
    """gpt-oss SwiGLU on interleaved gate/up columns; reads ``alpha`` and ``limit`` from the host module."""

    alpha: float
    limit: float
    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return activate("swigluoai_and_mul", x, float(self.alpha), float(self.limit))


class Silu(nn.Module):
    """``x * sigmoid(x)``."""

    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return activate("silu", x)


class Gelu(nn.Module):
    """Exact (erf) GELU."""

    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return activate("gelu", x)


class GeluTanh(nn.Module):
    """Tanh-approximated GELU."""

    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return activate("gelu_tanh", x)


class FastGELU(nn.Module):
    """transformers FastGELUActivation."""

    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return activate("gelu_fast", x)


class NewGELU(nn.Module):
    """transformers NewGELUActivation (GPT-2)."""

    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return activate("gelu_new", x)


class QuickGELU(nn.Module):
    """transformers QuickGELUActivation, ``x * sigmoid(1.702 * x)``."""

    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return activate("gelu_quick", x)


class DiffusersGELU(nn.Module):
    """diffusers ``models.activations.GELU``: its ``proj`` (a Linear), then exact GELU, or the
    tanh approximation with ``approximate="tanh"``. Reads ``proj`` and ``approximate``."""

    proj: nn.Module
    approximate: str
    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        op = "gelu_tanh" if self.approximate == "tanh" else "gelu"
        return activate(op, self.proj(hidden_states))


class DiffusersSwiGLU(nn.Module):
    """diffusers ``models.activations.SwiGLU``: ``h, gate = proj(x).chunk(2)``, ``h * silu(gate)``,
    i.e. ``mul_and_silu`` of the projection (one rounding instead of two). Reads ``proj``."""

    proj: nn.Module
    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return activate("mul_and_silu", self.proj(hidden_states))


class DiffusersApproximateGELU(nn.Module):
    """diffusers ``models.activations.ApproximateGELU``: ``proj``, then ``x * sigmoid(1.702 x)``
    (``gelu_quick``). Reads ``proj``."""

    proj: nn.Module
    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return activate("gelu_quick", self.proj(x))


def _not_inplace(module: nn.Module) -> bool:
    return not module.inplace


# attach_layers' default map: host class -> layer (or (layer, condition on the instance)). A bare
# name matches any class so named, "pkg.Name" only one defined under pkg. transformers' MLPs
# multiply by the up projection themselves, so only their activation is replaced there. diffusers'
# GEGLU (``h * gelu(gate)``, the gated half second) has no kernel of ours and is not listed.
HOST_CLASSES: Dict[str, object] = {
    "transformers.SiLUActivation": Silu,
    "transformers.GELUActivation": Gelu,
    "transformers.GELUTanh": GeluTanh,
    "transformers.NewGELUActivation": NewGELU,
    "transformers.FastGELUActivation": FastGELU,
    "transformers.QuickGELUActivation": QuickGELU,
    "torch.nn.SiLU": (Silu, _not_inplace),
    "diffusers.GELU": DiffusersGELU,
    "diffusers.SwiGLU": DiffusersSwiGLU,
    "diffusers.ApproximateGELU": DiffusersApproximateGELU,
}
