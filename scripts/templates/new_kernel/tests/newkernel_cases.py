"""Shared test data of the newkernel tests: dtypes, inputs and the tolerance table.

Tolerances (the only place they are defined). The kernels compute ``alpha * x`` in fp32 (fp64
for float64 data) and round the result once to the output dtype. Against a float64 reference on
the same inputs, one element is off by at most

    |out - ref| <= (half_ulp + compute) * |ref| + floor

* ``half_ulp = 2**-(m + 1)`` (m: explicit mantissa bits of the dtype): the final rounding;
* ``compute``: the rounding of the fp32 product before it (two fp32 unit roundoffs, with margin;
  none where the product is the final rounding, float32 and float64);
* ``floor = 2**-(e + 1)``, half the smallest subnormal of the dtype: a result that rounds to a
  subnormal is off by half a subnormal step, absolutely.
"""

from typing import Dict, Tuple

import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]

# dtype -> (half_ulp, compute, floor)
TOLERANCES: Dict[torch.dtype, Tuple[float, float, float]] = {
    torch.float32: (2.0**-24, 0.0, 2.0**-150),
    torch.float16: (2.0**-11, 2.0**-23, 2.0**-25),
    torch.bfloat16: (2.0**-8, 2.0**-23, 2.0**-134),
    torch.float64: (2.0**-53, 0.0, 0.0),
}


def make_input(shape, dtype, device, *, scale=1.0, seed=0) -> torch.Tensor:
    """Normal values (times `scale`) drawn in float64 on the CPU, so every device sees the same."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * scale
    return x.to(dtype=dtype, device=device)


def assert_within_bound(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """Every element of `out` within the table's bound of the float64 reference `ref`; NaN (an
    element the kernel did not write, in a pre-poisoned output) fails."""
    half_ulp, compute, floor = TOLERANCES[out.dtype]
    ref = ref.double().to(out.device)
    err = (out.double() - ref).abs()
    bound = (half_ulp + compute) * ref.abs() + floor
    bad = ~(err <= bound)
    assert not bool(bad.any()), (
        f"{what}: {int(bad.sum())} of {out.numel()} elements out of bound, max error "
        f"{err.max().item():.3g}, max bound {bound.max().item():.3g}"
    )
