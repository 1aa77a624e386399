"""`kernelize` layers: drop-in forwards for the RMSNorm modules of transformers and diffusers.

Each layer follows the kernels layer rules: no ``__init__``, no members besides ``forward`` and
the two flags, host-module state declared by annotation and read from the module the forward is
bound to. Every forward reproduces its host module's output dtype and casting (see
``_reference.llama_rms_norm`` / ``gemma_rms_norm`` / ``diffusers_rms_norm``), and goes through
the differentiable custom ops, so the layers work in TRAINING mode and under torch.compile
(fullgraph, no recompilation across token counts); the flags say so.
"""

from typing import Dict, Optional

import torch
import torch.nn as nn

from . import _custom_ops


class RMSNorm(nn.Module):
    """transformers ``LlamaRMSNorm`` (kernel layer name ``RMSNorm``, about 115 model classes).

    ``weight * round_x(x * rstd)``; the result has dtype ``promote_types(x, weight)``, as
    LlamaRMSNorm's. Reads ``weight`` and ``variance_epsilon`` (``eps`` when the host module has
    no ``variance_epsilon``).
    """

    weight: torch.Tensor
    variance_epsilon: float
    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        eps = getattr(self, "variance_epsilon", None)
        if eps is None:
            eps = self.eps
        return _custom_ops.llama_norm(hidden_states, self.weight, eps)


class LlamaRMSNorm(RMSNorm):
    """The same layer under transformers' class name."""


class GemmaRMSNorm(nn.Module):
    """transformers ``GemmaRMSNorm`` (Gemma, Gemma 2, Gemma 3): ``round_x(n * (1 + weight))``.

    fp32 throughout (``1 + weight`` too), one rounding to the dtype of ``x``. Reads ``weight``
    and ``eps``.
    """

    weight: torch.Tensor
    eps: float
    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _custom_ops.gemma_norm(x, self.weight, self.eps)


class DiffusersRMSNorm(nn.Module):
    """diffusers ``models.normalization.RMSNorm``, with its casting rules.

    Reads ``eps``, ``weight`` (None with ``elementwise_affine=False``) and ``bias`` (None unless
    ``bias=True``). No weight: ``round_x(n)``. Half-precision weight: ``n`` rounded to the weight
    dtype, the product in the weight dtype (whatever the input dtype). float32 weight: the
    product in float32, a float32 result. ``bias`` is added last.
    """

    weight: Optional[torch.Tensor]
    bias: Optional[torch.Tensor]
    eps: float
    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return _custom_ops.diffusers_norm(
            hidden_states, self.weight, getattr(self, "bias", None), self.eps
        )


class TorchRMSNorm(nn.Module):
    """``torch.nn.RMSNorm`` over the last dimension (``F.rms_norm``): ``round_x(n * weight)``,
    fp32 throughout, one rounding, the dtype of ``x`` whatever the weight's. Reads ``weight``
    (None without elementwise_affine) and ``eps`` (None: float32's machine epsilon, as
    ``F.rms_norm`` takes for float32 and half inputs)."""

    weight: Optional[torch.Tensor]
    eps: Optional[float]
    has_backward: bool = True
    can_torch_compile: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = self.eps if self.eps is not None else torch.finfo(torch.float32).eps
        return _custom_ops.norm(x, _custom_ops.kernel_weight(x, self.weight), eps)


def _last_dim_only(module: nn.Module) -> bool:
    return len(module.normalized_shape) == 1


# attach_layers' default map: host class -> layer (or (layer, condition on the instance)). A bare
# name matches any class so named (transformers' copies of one norm carry their model's prefix;
# their forwards are the same code, which the tests check); "pkg.Name" only one defined under
# pkg. Gemma 2 / 3 norms compute differently from GemmaRMSNorm and are not listed.
HOST_CLASSES: Dict[str, object] = {
    **{
        name: RMSNorm
        for name in (
            "LlamaRMSNorm",
            "MistralRMSNorm",
            "MixtralRMSNorm",
            "Qwen2RMSNorm",
            "Qwen3RMSNorm",
            "Qwen3MoeRMSNorm",
            "Phi3RMSNorm",
        )
    },
    "GemmaRMSNorm": GemmaRMSNorm,
    "diffusers.RMSNorm": DiffusersRMSNorm,
    "torch.nn.RMSNorm": (TorchRMSNorm, _last_dim_only),
}
