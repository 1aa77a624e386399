"""Shared test data for the activation tests: the op table, the dtypes, and the tolerance table.

Imported by the test modules (pytest puts this directory on sys.path); holds no kernel code.

Tolerances (the only place they are defined)
--------------------------------------------
The kernels compute in fp32 (fp64 for float64 data) and round each result once to the output
dtype. Against a float64 reference evaluated on the same (exactly representable) inputs, the
error of one element is therefore at most

    |out - ref| <= half_ulp * |ref|  +  compute * mag  +  floor

* ``half_ulp = 2**-(m + 1)``, with m the explicit mantissa bits of the output dtype: the final
  rounding to the dtype (half an ulp; an ulp is at most 2**-m relative in the normal range).
* ``compute * mag``: the error of the fp32 (fp64) evaluation, bounded by 16 unit roundoffs
  u = 2**-24 (2**-53) of ``mag``, the magnitude of the largest term of the formula before any
  cancellation. The formulas chain at most about eight correctly rounded operations and libm
  calls of at most 2 ulp each (CUDA's expf/erff/tanhf: 2 ulp), and the 1 + tanh(.), 1 + erf(.)
  and s * (1 + x * (1 - s)) steps cancel for negative x, so the error is relative to the terms,
  not to the (possibly tiny) result. ``mag`` (see ``magnitude``):
    - forward: |x| for elementwise ops; |x1| * |x2| for split gated ops; (1 + |up|) * |gate| for
      swigluoai.
    - backward: |grad_out| * (1 + |xa|)**3 for elementwise ops, times (1 + |xm|) for gated ops
      (xa: the activated element, xm: the multiplier); the cube covers the x * (1 + 3c x**2)
      term of the tanh-GELU derivative, the largest term of any derivative here.
* ``floor = 2**-(e + 1)`` with 2**-e the smallest subnormal of the output dtype: rounding to a
  subnormal is half an absolute subnormal step (only matters for fp16, 3e-8).

| dtype    | half_ulp (rel)   | compute (x mag)   | floor        |
|----------|------------------|-------------------|--------------|
| float32  | 2**-24 = 6.0e-8  | 2**-20 = 9.5e-7   | 2**-150      |
| float16  | 2**-11 = 4.9e-4  | 2**-20 = 9.5e-7   | 2**-25       |
| bfloat16 | 2**-8  = 3.9e-3  | 2**-20 = 9.5e-7   | 2**-134      |
| float64  | 2**-53 = 1.1e-16 | 2**-49 = 1.8e-15  | 2**-1075 (0) |

The float64 row also absorbs the float64 reference's own rounding (a few ulps, folded into the
16 u). The scalar parameters (threshold, alpha, limit) are rounded to float32 by the kernels and
by the reference alike.
"""

from dataclasses import dataclass, field
from typing import Dict, Tuple

import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
LOW_PRECISION = [torch.float16, torch.bfloat16]

# dtype -> (half_ulp, compute, floor); derivation in the module docstring.
TOLERANCES: Dict[torch.dtype, Tuple[float, float, float]] = {
    torch.float32: (2.0**-24, 16 * 2.0**-24, 2.0**-150),
    torch.float16: (2.0**-11, 16 * 2.0**-24, 2.0**-25),
    torch.bfloat16: (2.0**-8, 16 * 2.0**-24, 2.0**-134),
    torch.float64: (2.0**-53, 16 * 2.0**-53, 0.0),
}


@dataclass(frozen=True)
class OpCase:
    """One activation with one choice of its scalar parameters."""

    name: str
    gated: bool
    interleaved: bool = False  # swigluoai: gate = x[..., 0::2], up = x[..., 1::2]
    act_second: bool = False  # mul_and_silu: the activation applies to x[..., d:]
    scalars: Dict[str, float] = field(default_factory=dict)

    @property
    def id(self) -> str:
        params = ",".join(f"{k}={v}" for k, v in self.scalars.items())
        return f"{self.name}[{params}]" if params else self.name

    def out_shape(self, shape) -> Tuple[int, ...]:
        shape = tuple(shape)
        return shape[:-1] + (shape[-1] // 2,) if self.gated else shape

    def input_shape(self, leading, width) -> Tuple[int, ...]:
        """Input shape for `width` output columns (input width 2 * width for gated ops)."""
        return tuple(leading) + ((2 * width,) if self.gated else (width,))

    def call(self, kernel, *args):
        """The public function with this case's scalars as keywords."""
        return getattr(kernel, self.name)(*args, **self.scalars)

    def call_op(self, kernel, suffix, *tensors):
        """The C++ op `<name><suffix>` with this case's scalars as positional arguments."""
        return getattr(kernel.ops, self.name + suffix)(*tensors, *self.scalars.values())

    def reference(self, kernel, x, compute_dtype=torch.float64):
        return getattr(kernel._reference, self.name)(x, compute_dtype=compute_dtype, **self.scalars)


GATED_NAMES = [
    "silu_and_mul",
    "mul_and_silu",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "fatrelu_and_mul",
    "swigluoai_and_mul",
]
UNARY_NAMES = ["gelu", "gelu_tanh", "silu", "gelu_fast", "gelu_new", "gelu_quick"]
ALL_NAMES = GATED_NAMES + UNARY_NAMES

# One case per op with default scalars, plus non-default scalars (exact in float32) that move
# the fatrelu threshold and make the swigluoai clamps active on N(0, 3^2) data.
DEFAULT_CASES = [
    OpCase(
        name,
        gated=name in GATED_NAMES,
        interleaved=name == "swigluoai_and_mul",
        act_second=name == "mul_and_silu",
    )
    for name in ALL_NAMES
]
EXTRA_CASES = [
    OpCase("fatrelu_and_mul", gated=True, scalars={"threshold": 0.5}),
    OpCase("fatrelu_and_mul", gated=True, scalars={"threshold": -0.25}),
    OpCase("swigluoai_and_mul", gated=True, interleaved=True, scalars={"alpha": 1.0, "limit": 1.5}),
]
CASES = DEFAULT_CASES + EXTRA_CASES
CASE_IDS = [c.id for c in CASES]
DEFAULT_CASE_IDS = [c.id for c in DEFAULT_CASES]


def make_input(shape, dtype, device, scale=3.0, seed=0):
    """N(0, scale^2) data, exactly representable in `dtype` (generated in fp32, then cast)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(device=device, dtype=dtype)


def _split(case: OpCase, x: torch.Tensor):
    """(activated, multiplier) elements of a gated input, each [..., d]."""
    if case.interleaved:
        return x[..., 0::2], x[..., 1::2]
    d = x.shape[-1] // 2
    a, b = x[..., :d], x[..., d:]
    return (b, a) if case.act_second else (a, b)


def magnitude(case: OpCase, x: torch.Tensor, grad_out: torch.Tensor = None) -> torch.Tensor:
    """`mag` of the tolerance bound (module docstring), in float64, with the result's shape.

    Forward: the shape of the op's output. Backward (grad_out given): the shape of the input.
    """
    x = x.double().abs()
    if not case.gated:
        return x if grad_out is None else grad_out.double().abs() * (1 + x) ** 3
    xa, xm = _split(case, x)
    if grad_out is None:
        return (1 + xm) * xa if case.interleaved else xa * xm
    m = grad_out.double().abs() * (1 + xa) ** 3 * (1 + xm)
    if case.interleaved:
        return torch.stack([m, m], dim=-1).flatten(-2)
    return torch.cat([m, m], dim=-1)


def assert_within_bound(
    actual: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor, what: str = ""
) -> None:
    """|actual - ref| <= half_ulp * |ref| + compute * mag + floor, elementwise (TOLERANCES)."""
    half_ulp, compute, floor = TOLERANCES[actual.dtype]
    assert actual.shape == ref.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(ref.shape)}"
    actual64 = actual.detach().double().cpu()
    ref64 = ref.detach().double().cpu()
    bound = half_ulp * ref64.abs() + compute * mag.cpu() + floor
    err = (actual64 - ref64).abs()
    bad = ~(err <= bound)  # NaN counts as a failure
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements out of bound; first at {idx}: "
            f"got {actual64[idx].item()!r}, reference {ref64[idx].item()!r}, "
            f"error {err[idx].item():.3e} > bound {bound[idx].item():.3e}; "
            f"max error/bound {float((err / bound.clamp_min(1e-300)).nan_to_num(float('inf')).max()):.3g}"
        )
