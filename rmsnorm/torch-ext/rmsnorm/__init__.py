"""RMSNorm kernels: plain, fused residual add, Gemma and modulated forms, forward and backward.

A drop-in superset of the RMSNorm APIs of vLLM, flashinfer / sgl-kernel and
kernels-community/rmsnorm v1, plus differentiable functional forms for training. Math (fp32
throughout, every result rounded once to its dtype) and dtype rules: kernel_src/rmsnorm_params.h.

With ``n = x / sqrt(mean(x**2, -1) + eps)`` over the last dimension (``hidden``):

* vLLM (out-param / in-place, **not differentiable**): ``rms_norm(out, input, weight, epsilon)``,
  ``fused_add_rms_norm(input, residual, weight, epsilon)``, ``gemma_rms_norm``,
  ``gemma_fused_add_rms_norm``. LlamaRMSNorm casting: ``out = round(round_in(n) * weight)``.
* flashinfer / sgl-kernel: ``rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None)``,
  ``fused_add_rmsnorm``, ``gemma_rmsnorm``, ``gemma_fused_add_rmsnorm``. flashinfer casting:
  ``out = round(n * weight)`` (one rounding). Differentiable when they allocate (``out=None``).
* training (differentiable, torch.compile-able, no recompilation across token counts):
  ``rms_norm_func``, ``add_rms_norm``, ``rms_norm_modulate``.
* kernels-community/rmsnorm v1: ``apply_rms_norm``, ``apply_rms_norm_backward``.
* ``layers``: ``RMSNorm`` / ``LlamaRMSNorm``, ``GemmaRMSNorm``, ``DiffusersRMSNorm``,
  ``TorchRMSNorm`` for ``kernelize``; ``attach_layers(model)`` puts them on a transformers or
  diffusers model by host class (what works with kernels < 0.18.2, where ``kernelize`` finds
  nothing to replace in transformers models).

Inputs are ``[..., hidden]`` tensors of float32, float16 or bfloat16 (any leading dimensions,
none included; rows may be strided views). ``weight`` is ``[hidden]`` in the input dtype or
float32, or None (no weight). ``eps`` must be positive; it is rounded to float32. Outputs have
the input dtype unless stated otherwise. Double backward is not supported.

Every function takes ``enable_pdl: Optional[bool] = None``: programmatic dependent launch on CUDA
(sm_90+). None keeps each launch's measured default (an op's first kernel plain, since after a
GEMM a PDL launch was slower; the backward's reduce kernel with PDL), True turns it on for every
launch (for a call that follows a kernel that releases its dependents), False off. Ignored on CPU.
"""

from typing import List, Optional, Tuple

import torch

from . import _custom_ops, _hub_layers, _reference, layers
from ._ops import add_op_namespace_prefix, ops

__all__ = [
    # vLLM
    "rms_norm",
    "fused_add_rms_norm",
    "gemma_rms_norm",
    "gemma_fused_add_rms_norm",
    # flashinfer / sgl-kernel
    "rmsnorm",
    "fused_add_rmsnorm",
    "gemma_rmsnorm",
    "gemma_fused_add_rmsnorm",
    # differentiable functional forms
    "rms_norm_func",
    "add_rms_norm",
    "rms_norm_modulate",
    # kernels-community/rmsnorm v1
    "apply_rms_norm",
    "apply_rms_norm_backward",
    "layers",
    "attach_layers",
]


# ---- vLLM: out-param and in-place, not differentiable ----


def rms_norm(
    out: torch.Tensor,
    input: torch.Tensor,
    weight: Optional[torch.Tensor],
    epsilon: float,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """vLLM ``rms_norm``: writes ``out = round_out(round_in(n) * weight)`` and returns ``out``.

    The casting of transformers' LlamaRMSNorm: the normalized value is rounded to the input dtype
    before the weight multiplies it. ``out`` has the input's shape, the input dtype or float32
    (float32 with a float32 weight reproduces LlamaRMSNorm's promotion), and unit stride along
    its last dimension. ``weight`` None means no weight. Not seen by autograd.
    """
    ops.rms_norm(out, input, weight, float(epsilon), enable_pdl)
    return out


def fused_add_rms_norm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    epsilon: float,
    enable_pdl: Optional[bool] = None,
) -> None:
    """vLLM ``fused_add_rms_norm``, in place: ``residual <- input + residual`` (rounded to the
    input dtype), then ``input <- rms_norm(residual)`` with ``rms_norm``'s casting. Both tensors
    are updated; they must have the same shape and dtype. Not seen by autograd."""
    ops.fused_add_rms_norm(input, residual, weight, float(epsilon), enable_pdl)


def gemma_rms_norm(
    out: torch.Tensor,
    input: torch.Tensor,
    weight: Optional[torch.Tensor],
    epsilon: float,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """Gemma RMSNorm: writes ``out = round_out(n * (1 + weight))``, fp32 throughout (one
    rounding, as transformers' GemmaRMSNorm), and returns ``out``. Not seen by autograd."""
    ops.gemma_rms_norm(out, input, weight, float(epsilon), enable_pdl)
    return out


def gemma_fused_add_rms_norm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    epsilon: float,
    enable_pdl: Optional[bool] = None,
) -> None:
    """In place: ``residual <- input + residual``, ``input <- gemma_rms_norm(residual)``."""
    ops.gemma_fused_add_rms_norm(input, residual, weight, float(epsilon), enable_pdl)


# ---- flashinfer / sgl-kernel ----


def rmsnorm(
    input: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float = 1e-6,
    out: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """flashinfer ``rmsnorm``: ``round(n * weight)``, fp32 throughout, one rounding.

    With ``out`` given, writes it (input dtype or float32) and returns it, outside autograd;
    otherwise returns a new tensor of the input dtype, differentiable. ``enable_pdl`` as everywhere
    (see the module docstring). The flashinfer / sgl forms accept
    a weight of any float dtype of the kernel (a half weight of the other half dtype is widened to
    float32, exactly).
    """
    w = _custom_ops.kernel_weight(input, weight)
    if out is None:
        return _custom_ops.norm(input, w, eps, enable_pdl=enable_pdl)
    ops.rms_norm_fwd(out, input, w, None, None, None, None, None, float(eps), 0.0, None, enable_pdl)
    return out


def fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float = 1e-6,
    enable_pdl: Optional[bool] = None,
) -> None:
    """flashinfer ``fused_add_rmsnorm``, in place: ``residual <- input + residual`` (rounded to
    the input dtype), ``input <- round(rms_norm(residual) * weight)`` with one rounding.
    Not seen by autograd (use ``add_rms_norm`` for training)."""
    w = _custom_ops.kernel_weight(input, weight)
    ops.rms_norm_fwd(
        input, input, w, residual, residual, None, None, None, float(eps), 0.0, None, enable_pdl
    )


def gemma_rmsnorm(
    input: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float = 1e-6,
    out: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """flashinfer ``gemma_rmsnorm``: ``round(n * (1 + weight))``, fp32 throughout.

    ``out`` and ``enable_pdl`` as in ``rmsnorm``; differentiable when ``out`` is None.
    """
    if out is None:
        return _custom_ops.gemma_norm(input, weight, eps, enable_pdl)
    ops.gemma_rms_norm(out, input, _custom_ops.kernel_weight(input, weight), float(eps), enable_pdl)
    return out


def gemma_fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float = 1e-6,
    enable_pdl: Optional[bool] = None,
) -> None:
    """flashinfer ``gemma_fused_add_rmsnorm``, in place: ``residual <- input + residual``,
    ``input <- gemma_rmsnorm(residual)``. Not seen by autograd."""
    ops.gemma_fused_add_rms_norm(
        input, residual, _custom_ops.kernel_weight(input, weight), float(eps), enable_pdl
    )


# ---- differentiable functional forms ----


def rms_norm_func(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    *,
    gemma: bool = False,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """Differentiable RMSNorm with transformers' casting (grads for ``x`` and ``weight``).

    ``gemma=False``: LlamaRMSNorm, ``weight * round_x(n)``; the result has dtype
    ``promote_types(x.dtype, weight.dtype)`` (float32 for a float32 weight with half-precision
    ``x``), exactly what ``LlamaRMSNorm`` returns. ``gemma=True``: GemmaRMSNorm,
    ``round_x(n * (1 + weight))`` in fp32, dtype of ``x``. A half-precision weight of another
    dtype than ``x`` is widened to float32 first (exact). torch.compile traces it as one opaque
    op (fullgraph, dynamic token counts).
    """
    if gemma:
        return _custom_ops.gemma_norm(x, weight, eps, enable_pdl)
    return _custom_ops.llama_norm(x, weight, eps, enable_pdl)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    *,
    gemma: bool = False,
    enable_pdl: Optional[bool] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Differentiable, out-of-place fused residual add: returns ``(out, residual_out)``.

    ``residual_out = round_x(x + residual)`` (the new residual stream, dtype of ``x``; ``residual``
    must have the shape and dtype of ``x``) and ``out = rms_norm_func(residual_out, weight, eps,
    gemma=gemma)`` (same casting and output dtype). Gradients flow to ``x``, ``residual`` and
    ``weight``, from both outputs. The inputs are not modified.
    """
    w = _custom_ops.kernel_weight(x, weight)
    if gemma:
        return _custom_ops.add_norm(x, residual, w, eps, weight_offset=1.0, enable_pdl=enable_pdl)
    return _custom_ops.add_norm(
        x,
        residual,
        w,
        eps,
        norm_dtype=x.dtype,
        out_dtype=_custom_ops.promoted_dtype(x, weight),
        enable_pdl=enable_pdl,
    )


def rms_norm_modulate(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    scale: torch.Tensor,
    shift: torch.Tensor,
    eps: float = 1e-6,
    *,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """Differentiable adaptive (modulated) RMSNorm of diffusion transformers.

    ``round_x(n * weight * (1 + scale[b]) + shift[b])``, fp32 throughout, for ``x`` of shape
    ``[B, ..., hidden]`` and ``scale``, ``shift`` of shape ``[B, hidden]`` or ``[B, 1, hidden]``
    in the dtype of ``x`` (one pair per sample ``b``, broadcast over its tokens). ``weight`` may
    be None. Gradients flow to ``x``, ``weight``, ``scale`` and ``shift``. The result has the
    dtype of ``x``.
    """
    return _custom_ops.modulated_norm(x, weight, scale, shift, eps, enable_pdl)


# ---- kernels-community/rmsnorm v1 ----


def apply_rms_norm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    return_rstd: bool = False,
    *,
    enable_pdl: Optional[bool] = None,
):
    """kernels-community/rmsnorm ``apply_rms_norm``: the LlamaRMSNorm forward, not differentiable.

    Returns the output tensor, as kernels-community's function does (its op returns
    ``[out, rstd]`` and the function keeps ``out``); with ``return_rstd=True`` returns
    ``[out, rstd]``, rstd being ``1 / sqrt(mean(input**2, -1) + eps)`` in float32 with shape
    ``input.shape[:-1]``. Output dtype as ``rms_norm_func``.
    """
    w = _custom_ops.kernel_weight(input, weight)
    out = torch.empty(
        input.shape, dtype=_custom_ops.promoted_dtype(input, weight), device=input.device
    )
    rstd = (
        torch.empty(input.shape[:-1], dtype=torch.float32, device=input.device)
        if return_rstd
        else None
    )
    ops.rms_norm_fwd(
        out, input, w, None, None, None, None, rstd, float(eps), 0.0, input.dtype, enable_pdl
    )
    return [out, rstd] if return_rstd else out


def apply_rms_norm_backward(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    output: Optional[torch.Tensor],
    rstd: Optional[torch.Tensor],
    eps: float,
    input_requires_grad: bool = True,
    weight_requires_grad: bool = True,
    *,
    enable_pdl: Optional[bool] = None,
) -> List[Optional[torch.Tensor]]:
    """kernels-community/rmsnorm ``apply_rms_norm_backward``: ``[grad_input, grad_weight]`` of
    ``apply_rms_norm``, None for a gradient not asked for.

    ``output`` and ``rstd`` are accepted for compatibility and not read: the kernel recomputes
    rstd from ``input``, as the backward of the differentiable forms does.
    ``grad_output`` has the dtype of ``apply_rms_norm``'s output.
    """
    w = _custom_ops.kernel_weight(input, weight)
    grad_input = torch.empty(input.shape, dtype=input.dtype, device=input.device)
    want_weight = weight_requires_grad and weight is not None
    grad_weight = torch.empty(w.shape, dtype=w.dtype, device=w.device) if want_weight else None
    ops.rms_norm_bwd(
        grad_input,
        grad_weight,
        None,
        None,
        grad_output,
        input,
        w,
        None,
        None,
        float(eps),
        0.0,
        input.dtype,
        enable_pdl,
    )
    if grad_weight is not None and grad_weight.dtype != weight.dtype:
        grad_weight = grad_weight.to(weight.dtype)
    return [grad_input if input_requires_grad else None, grad_weight]


# ---- attaching the kernelize layers to a model ----


attach_layers = _hub_layers.entry_point(
    __name__,
    layers,
    add_op_namespace_prefix,
    """Give the RMSNorm modules of a transformers / diffusers / PyTorch model our layers' forwards,
    by host class; returns ``{host class: modules replaced}``.

    Default host classes (``classes=None``): transformers' ``LlamaRMSNorm``, ``MistralRMSNorm``,
    ``MixtralRMSNorm``, ``Qwen2RMSNorm``, ``Qwen3RMSNorm`` (per-head ``q_norm`` / ``k_norm``
    included), ``Qwen3MoeRMSNorm``, ``Phi3RMSNorm`` -> ``layers.RMSNorm``; ``GemmaRMSNorm`` ->
    ``layers.GemmaRMSNorm`` (``1 + weight``); ``diffusers.RMSNorm`` (any ``elementwise_affine``,
    ``bias``) -> ``layers.DiffusersRMSNorm``; ``torch.nn.RMSNorm`` over one dimension ->
    ``layers.TorchRMSNorm`` (the full map: ``layers.HOST_CLASSES``).
    """,
)


# An error raised through a public function or a layer names it, not the op it reached
# (_public_errors.py).
from . import _public_errors  # noqa: E402

_public_errors.wrap_public([globals()], __all__, add_op_namespace_prefix)
_public_errors.wrap_layers(layers, add_op_namespace_prefix)
