"""The reference of the quant tests: the documented rounding rules (the package docstring,
CARD.md), written independently of the package's own _reference module, in fp32 PyTorch.

Every function returns what the kernel must return bit for bit (fp8 as float8_e4m3fn, int8,
float32 scales, int32 zero points); inputs are any float tensor [..., hidden], on any device.
Divisions by a constant go through `div` (a tensor divisor): on CUDA `t / 448.0` with a Python
number multiplies by 1 / 448, rounding twice.
"""

import torch

FP8_MAX = 448.0
FP8_MIN_SCALE = 1.0 / (448.0 * 512.0)
I32_MIN, I32_MAX = -(2**31), 2**31 - 1


def div(t: torch.Tensor, c: float) -> torch.Tensor:
    """t / c in one IEEE division on every device (a Python-number divisor is t * (1 / c) on
    CUDA)."""
    return t / torch.full_like(t, c)


def rows(x: torch.Tensor) -> torch.Tensor:
    """x as fp32 rows [M, hidden] (exact widening)."""
    m = 1
    for size in x.shape[:-1]:
        m *= size
    return x.float().reshape(m, x.shape[-1])


def fp8(v: torch.Tensor) -> torch.Tensor:
    """Saturate to +-448 (NaN kept, its sign dropped), then round to nearest even."""
    c = v.clamp(-FP8_MAX, FP8_MAX)
    return torch.where(c.isnan(), c.abs(), c).to(torch.float8_e4m3fn)


def nanless_amax(v: torch.Tensor, dim=None) -> torch.Tensor:
    """max |v| skipping NaN (fmaxf), 0 for no element."""
    a = torch.nan_to_num(v.abs(), nan=0.0)
    if dim is None:
        return a.amax() if a.numel() else torch.zeros((), dtype=a.dtype)
    if a.shape[-1] == 0:  # rows of no element (dim is always -1 here)
        return torch.zeros(*a.shape[:-1], 1, dtype=a.dtype)
    return a.amax(dim=dim, keepdim=True)


def static_fp8(x, scale):
    inv = 1.0 / scale.float().reshape(())
    return fp8(x.float() * inv)


def dynamic_fp8(x):
    scale = torch.clamp(div(nanless_amax(x.float()), FP8_MAX), min=FP8_MIN_SCALE).reshape(1)
    return static_fp8(x, scale), scale


def per_token_fp8(x, scale_ub=None):
    xr = rows(x)
    amax = nanless_amax(xr, dim=-1)
    if scale_ub is not None:
        amax = torch.minimum(amax, scale_ub.float().reshape(()))
    scale = torch.clamp(div(amax, FP8_MAX), min=FP8_MIN_SCALE)
    return fp8(xr / scale).reshape(x.shape), scale


def int8_sat(v):
    """round half even, NaN -> 0, saturate to int8."""
    return torch.nan_to_num(torch.round(v), nan=0.0).clamp(-128, 127).to(torch.int8)


def int8_azp(v, azp):
    """sat8(sat32(round(v)) + azp), NaN -> azp; int64 arithmetic."""
    r = torch.nan_to_num(torch.round(v), nan=0.0).clamp(I32_MIN, I32_MAX).to(torch.int64)
    return (r + azp.to(torch.int64)).clamp(-128, 127).to(torch.int8)


def static_int8(x, scale, azp=None):
    v = x.float() / scale.float().reshape(())
    return int8_sat(v) if azp is None else int8_azp(v, azp.reshape(()))


def per_token_int8_sym(x):
    xr = rows(x)
    amax = nanless_amax(xr, dim=-1)
    # full_like(127) / amax, not 127.0 / amax: Tensor.__rtruediv__ is reciprocal() * 127, which
    # rounds twice (127 / 8.4375 came out one ulp low and flipped a rounding of x * mul).
    mul = torch.where(amax == 0, torch.zeros_like(amax), torch.full_like(amax, 127.0) / amax)
    return int8_sat(xr * mul).reshape(x.shape), div(amax, 127.0)


def per_token_int8_asym(x):
    xr = rows(x)
    if xr.shape[1] == 0:
        mn = torch.full((xr.shape[0], 1), float("inf"))
        mx = -mn
    else:
        mn = torch.where(xr.isnan(), float("inf"), xr).amin(dim=-1, keepdim=True)
        mx = torch.where(xr.isnan(), float("-inf"), xr).amax(dim=-1, keepdim=True)
    empty = ~(mn <= mx)  # no number in the row (empty or all NaN): a zero row
    mn = torch.where(empty, torch.zeros_like(mn), mn)
    mx = torch.where(empty, torch.zeros_like(mx), mx)
    constant = mn == mx
    mn = torch.where(constant, torch.clamp(mn, max=0.0), mn)
    mx = torch.where(constant, torch.clamp(mx, min=0.0), mx)
    scale = div(mx - mn, 255.0)
    zero = scale == 0
    safe = torch.where(zero, torch.ones_like(scale), scale)
    z = torch.round(-128.0 - mn / safe)
    azp = torch.nan_to_num(z, nan=0.0).clamp(I32_MIN, I32_MAX).to(torch.int64)
    azp = torch.where(zero, torch.full_like(azp, -128), azp)
    q = int8_azp(xr / safe, azp)
    q = torch.where(zero, azp.to(torch.int8).expand_as(q), q)
    return (
        q.reshape(x.shape),
        torch.where(zero, torch.zeros_like(scale), scale),
        azp.to(torch.int32),
    )


def group_fp8(x, group_size, eps=1e-10, ue8m0=False):
    xg = x.float().reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size)
    amax = torch.nan_to_num(xg.abs(), nan=0.0).amax(dim=-1, keepdim=True)
    scale = div(torch.clamp(amax, min=eps), FP8_MAX)
    if ue8m0:
        # The smallest power of two >= scale, exactly (log2 in fp32 may round s = 2^k (1 + ulp)
        # down to k): frexp gives scale = m * 2^e with m in [0.5, 1).
        m, e = torch.frexp(torch.clamp(scale, min=1e-10))
        scale = torch.ldexp(torch.ones_like(m), torch.where(m == 0.5, e - 1, e))
    return fp8(xg / scale).reshape(x.shape), scale.squeeze(-1)
