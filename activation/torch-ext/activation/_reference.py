"""Plain-PyTorch references of every activation of this kernel (private, not in `__all__`).

Used by the tests and by benchmarks/benchmark.py through the loaded kernel (`kernel._reference`).
Each function takes the input tensor (and the op's scalars) and computes in
`torch.promote_types(x.dtype, compute_dtype)`: pass `compute_dtype=torch.float64` for an
accuracy reference, `torch.float32` for the fp32 reference the benchmarks cast to the output
dtype. The result keeps the compute dtype; it is differentiable (plain autograd).

Scalar parameters (threshold, alpha, limit) are rounded to float32 first, because the kernels
receive them as float32 (as vLLM's kernels do); the formulas themselves are those cited in
kernel_src/activation_math.h.
"""

import math

import torch
import torch.nn.functional as F

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _upcast(x: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, compute_dtype))


def _as_float32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))


def _halves(x: torch.Tensor):
    d = x.shape[-1] // 2
    return x[..., :d], x[..., d:]


# ---- unary ----


def silu(x: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return F.silu(_upcast(x, compute_dtype))


def gelu(x: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return F.gelu(_upcast(x, compute_dtype))


def gelu_tanh(x: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return F.gelu(_upcast(x, compute_dtype), approximate="tanh")


def gelu_new(x: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    # transformers NewGELUActivation (GPT-2).
    x = _upcast(x, compute_dtype)
    return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * torch.pow(x, 3.0))))


def gelu_fast(x: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    # transformers FastGELUActivation.
    x = _upcast(x, compute_dtype)
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def gelu_quick(x: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    # transformers QuickGELUActivation.
    x = _upcast(x, compute_dtype)
    return x * torch.sigmoid(1.702 * x)


# ---- gated, split layout: x = [x1 | x2] along the last dimension ----


def silu_and_mul(x: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    x1, x2 = _halves(_upcast(x, compute_dtype))
    return F.silu(x1) * x2


def mul_and_silu(x: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    x1, x2 = _halves(_upcast(x, compute_dtype))
    return x1 * F.silu(x2)


def gelu_and_mul(x: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    x1, x2 = _halves(_upcast(x, compute_dtype))
    return F.gelu(x1) * x2


def gelu_tanh_and_mul(x: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    x1, x2 = _halves(_upcast(x, compute_dtype))
    return F.gelu(x1, approximate="tanh") * x2


def fatrelu_and_mul(
    x: torch.Tensor, threshold: float = 0.0, compute_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    # MiniCPM-S / vLLM FatreluAndMul: x1 where x1 > threshold, else 0.
    x1, x2 = _halves(_upcast(x, compute_dtype))
    return torch.where(x1 > _as_float32(threshold), x1, torch.zeros_like(x1)) * x2


# ---- gated, interleaved layout: gate = x[..., 0::2], up = x[..., 1::2] ----


def swigluoai_and_mul(
    x: torch.Tensor,
    alpha: float = 1.702,
    limit: float = 7.0,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    # gpt-oss / vLLM SwigluOAIAndMul.
    x = _upcast(x, compute_dtype)
    alpha, limit = _as_float32(alpha), _as_float32(limit)
    gate = x[..., 0::2].clamp(max=limit)
    up = x[..., 1::2].clamp(min=-limit, max=limit)
    return (up + 1.0) * gate * torch.sigmoid(alpha * gate)
