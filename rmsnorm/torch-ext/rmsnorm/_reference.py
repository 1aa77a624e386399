"""Plain-PyTorch references of the RMSNorm ops of this kernel (private, not in `__all__`).

Reached through the loaded kernel (`kernel._reference`) by the tests and the benchmarks; the
semantics are those of kernel_src/rmsnorm_params.h.

Two kinds of reference:

* `rms_norm`, `add_rms_norm`, `rstd`: the kernel's math, evaluated in
  `torch.promote_types(x.dtype, compute_dtype)`. Pass `compute_dtype=torch.float64` for an
  accuracy reference, `torch.float32` for the fp32 reference that benchmarks cast to the output
  dtype. The intermediate rounding of the normalized value to `norm_dtype` is applied only when
  `norm_dtype` is given (leave it None for the exact math). The result keeps the compute dtype
  and is differentiable by plain autograd; roundings pass gradients straight through, like
  `.to()` does, which is also what the kernel's backward assumes.
* `llama_rms_norm`, `gemma_rms_norm`, `diffusers_rms_norm`: the forwards of transformers'
  `LlamaRMSNorm` and `GemmaRMSNorm` (5.x) and diffusers' `RMSNorm` (0.42, non-NPU branch),
  written out with the same torch ops in the same precision (eager baselines, and what the
  layers of `layers.py` must reproduce, output dtype included).

`eps` is rounded to float32 first, since the kernels (and the fp32 variance tensors of the
framework references) receive it as a float32.
"""

from typing import Optional, Tuple

import torch


def _as_float32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))


def _upcast(t: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
    return t.to(torch.promote_types(t.dtype, compute_dtype))


def _per_sample(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """scale/shift, [B, D] or [B, 1, D], viewed so that it broadcasts over x = [B, ..., D]."""
    return t.reshape(t.shape[0], *([1] * (x.dim() - 2)), t.shape[-1])


def rstd(
    x: torch.Tensor, eps: float = 1e-6, compute_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``1 / sqrt(mean(x**2, -1) + eps)``, shape ``x.shape[:-1]``."""
    x = _upcast(x, compute_dtype)
    return torch.rsqrt(x.pow(2).mean(-1) + _as_float32(eps))


def rms_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    *,
    weight_offset: float = 0.0,
    norm_dtype: Optional[torch.dtype] = None,
    scale: Optional[torch.Tensor] = None,
    shift: Optional[torch.Tensor] = None,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``n * (weight_offset + weight) [* (1 + scale) + shift]`` with ``n = x * rstd(x)``.

    ``n`` is rounded to ``norm_dtype`` when given (LlamaRMSNorm: the input dtype). ``scale`` and
    ``shift`` are per sample, ``[B, D]`` or ``[B, 1, D]`` for ``x = [B, ..., D]``.
    """
    xc = _upcast(x, compute_dtype)
    n = xc * rstd(xc, eps, compute_dtype).unsqueeze(-1)
    if norm_dtype is not None:
        n = n.to(norm_dtype).to(xc.dtype)
    y = n
    if weight is not None:
        y = y * (weight_offset + _upcast(weight, compute_dtype))
    if scale is not None:
        y = y * (1.0 + _per_sample(_upcast(scale, compute_dtype), x))
    if shift is not None:
        y = y + _per_sample(_upcast(shift, compute_dtype), x)
    return y


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    *,
    weight_offset: float = 0.0,
    norm_dtype: Optional[torch.dtype] = None,
    compute_dtype: torch.dtype = torch.float32,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(r), r)`` with ``r = x + residual`` rounded to the input dtype.

    The sum is taken in the dtype of ``x`` (PyTorch adds half-precision tensors in fp32 and
    rounds once, as the kernel does), so ``r`` is bitwise what the kernel writes to the residual.
    """
    r = x + residual
    return rms_norm(
        r,
        weight,
        eps,
        weight_offset=weight_offset,
        norm_dtype=norm_dtype,
        compute_dtype=compute_dtype,
    ), r


# ---- framework forwards, op for op ----


def llama_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """transformers ``LlamaRMSNorm.forward``: ``weight * round_x(x * rstd)``, dtype promote(weight, x)."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """transformers ``GemmaRMSNorm.forward``: ``round_x(n * (1 + weight))`` in fp32."""
    h = x.float()
    out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = out * (1.0 + weight.float())
    return out.type_as(x)


def diffusers_rms_norm(
    x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float
) -> torch.Tensor:
    """diffusers ``RMSNorm.forward`` (non-NPU branch).

    ``n = x * rstd`` is fp32. Half-precision weight: round n to the *weight* dtype and multiply
    there. fp32 weight: multiply in fp32 (fp32 result). No weight: round n to the input dtype.
    ``bias`` is added last.
    """
    input_dtype = x.dtype
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    h = x * torch.rsqrt(variance + eps)
    if weight is not None:
        if weight.dtype in (torch.float16, torch.bfloat16):
            h = h.to(weight.dtype)
        h = h * weight
        if bias is not None:
            h = h + bias
    else:
        h = h.to(input_dtype)
    return h
