"""Plain PyTorch versions of the quantize ops (private): the eager code the benchmarks compare
with (and torch.compile) and the references `kernels benchmark` verifies against. They follow the
rounding of the package docstring, so on inputs without NaN they match the kernels bit for bit,
on CPU and CUDA.

Divisions by a constant go through `_div` (a tensor divisor): on CUDA, `t / 448.0` with a Python
number is `t * (1 / 448)` (PyTorch's CPU-scalar path of division), rounded twice, and put
per-token and group scales one ulp off the kernels'. `127.0 / t` is `t.reciprocal() * 127` on
every device, so the numerator is a tensor too.
"""

from typing import Optional, Tuple

import torch

FP8_MAX = 448.0
FP8_MIN_SCALE = 1.0 / (448.0 * 512.0)


def _div(t: torch.Tensor, c: float) -> torch.Tensor:
    """t / c in one IEEE division on every device."""
    return t / torch.full_like(t, c)


def _fp8(x: torch.Tensor) -> torch.Tensor:
    c = x.clamp(-FP8_MAX, FP8_MAX)
    return torch.where(c.isnan(), c.abs(), c).to(torch.float8_e4m3fn)  # NaN loses its sign


def static_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return _fp8(x.float() * (1.0 / scale.float()))


def dynamic_fp8(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    scale = _div(x.float().abs().amax(), FP8_MAX).clamp(min=FP8_MIN_SCALE).reshape(1)
    return static_fp8(x, scale), scale


def per_token_fp8(
    x: torch.Tensor, scale_ub: Optional[torch.Tensor] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    xf = x.float().reshape(-1, x.shape[-1])
    amax = xf.abs().amax(dim=-1, keepdim=True)
    if scale_ub is not None:
        amax = torch.minimum(amax, scale_ub.float())
    scale = _div(amax, FP8_MAX).clamp(min=FP8_MIN_SCALE)
    return _fp8(xf / scale).reshape(x.shape), scale


def group_fp8(
    x: torch.Tensor, group_size: int, eps: float = 1e-10
) -> Tuple[torch.Tensor, torch.Tensor]:
    xg = x.float().reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size)
    scale = _div(xg.abs().amax(dim=-1, keepdim=True).clamp(min=eps), FP8_MAX)
    return _fp8(xg / scale).reshape(x.shape), scale.squeeze(-1)


def per_token_int8(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    xf = x.float().reshape(-1, x.shape[-1])
    amax = xf.abs().amax(dim=-1, keepdim=True)
    mul = torch.where(amax == 0, torch.zeros_like(amax), torch.full_like(amax, 127.0) / amax)
    q = torch.round(xf * mul).clamp(-128, 127).to(torch.int8)
    return q.reshape(x.shape), _div(amax, 127.0)
