"""Shared test data and the tolerance model of the rmsnorm tests (no kernel code).

Every check compares the kernel with a float64 evaluation of the exact math of
kernel_src/rmsnorm_params.h on the kernel's own (exactly representable) inputs. The float64
reference applies no intermediate rounding; the bounds below say how far a correct fp32
implementation can be from it. They are derived from the roundings the contract prescribes and
the fp32 accumulation error, never fitted to measurements.

Notation: u = 2**-24 (fp32 unit roundoff); H = hidden size; h_T = half an ulp of dtype T,
relative (2**-(m + 1), m explicit mantissa bits); f_T = half the smallest subnormal of T
(absolute floor of one rounding to T).

| dtype    | h_T               | f_T     |
|----------|-------------------|---------|
| float32  | 2**-24 = 6.0e-8   | 2**-150 |
| float16  | 2**-11 = 4.9e-4   | 2**-25  |
| bfloat16 | 2**-8  = 3.9e-3   | 2**-134 |

Accumulation. A sum of N fp32 terms has a relative error (w.r.t. the sum of the absolute values
of its terms) of at most acc(N) * u with acc(N) = min(N, 8 * sqrt(N)):
* N is the worst case for any summation order (Higham, Accuracy and Stability of Numerical
  Algorithms, 2nd ed., section 4.2: at most N - 1 additions on any path of the summation tree,
  plus the rounding of each term);
* 8 * sqrt(N) is the probabilistic bound of Higham & Mary (SIAM J. Sci. Comput. 41(5), 2019,
  Theorem 2.4, lambda = 8): it holds with probability >= 1 - 2 * exp(-32) ~ 1 - 2.5e-14 per sum
  when the rounding errors are independent and of mean zero, which random test data satisfies.
  The kernels' blocked/tree reductions have paths far shorter than either (CPU: 16 lanes, 1024-
  element blocks), so no implementation detail is assumed.

rstd = 1/sqrt(mean(r^2) + eps): relative error
    e_rstd(H) = (acc(H) + 3) * u / 2 + 4u
(mean(r^2) + eps: the sum of the rounded squares, acc(H) u, their rounding included; the mean,
up to 2u when computed as sum * fl(1/H); + eps, u; all terms are positive, so these relative
errors add. The square root halves the relative error of its argument; the reciprocal square
root, a sqrt and a division or CUDA's rsqrtf (2 ulp), adds at most 2 ulp = 4u.) n = r * rstd,
rounded once in fp32: e_n(H) = e_rstd(H) + u. For data whose sums of squares are exact in any
order (small integers), acc(H) is 0 (`exact_sum`): e_rstd = 3u/2 + 4u.

Forward, y = n' * w' * m + shift (w' = weight_offset + weight, m = 1 + scale, n' = n rounded to
norm_dtype when the casting says so, else n), out = round_out(y):
    |out - y_ref| <= h_out * |y_ref| + f_out
                     + (1 + h_out) * [(h_norm + e_n + 4u) * P + f_norm * |w' m| + u * (P + |shift|)]
with P = |n * w' * m| (float64). The 4u cover w' = offset + w, m = 1 + scale and the two
products; u * (P + |shift|) the add of shift (no relative bound there: it may cancel). The
first term is the output's own rounding: the bound is half an ulp of the output plus the fp32
error, as the kernel's result is rounded once from an fp32 value.

Backward (float64 autograd of the same reference; gy = grad_out * m, gn = gy * w',
M = mean over the row of |gn * n|):
    grad_input: mag = rstd * (|gn| + |n| * M), relative error of the fp32 evaluation
                e_rstd + e_n + (acc(H) + 8) u (the dot product mean(gn * n) sums H terms of both
                signs, hence mag and not |grad_input|: the formula cancels), plus u * |grad_residual|
                for the residual gradient add, then h_in * |ref| + f_in for the final rounding.
    grad_weight: sum over the R rows of gy * n': mag = sum |gy * n|, relative error
                 e_n + h_norm + (acc(R) + 4) u (n' vs n: the reference does not round).
    grad_scale: sum over the S rows of a sample of grad_out * n' * w': mag = sum |g * n * w'|,
                e_n + (acc(S) + 4) u.  grad_shift: sum of grad_out: mag = sum |g|, (acc(S) + 1) u.

Exact checks ("decided" elements). Rounding and fp32 products are monotone, so the kernel's
pipeline out = round_out(fl32(round_norm(n) * fl32(offset + w))) is a monotone function of its
fp32 n, which lies within n_ref * (1 +- e_n). Where that pipeline gives the same value at both
ends of the interval, the kernel's output must equal it bit for bit: this verifies the
prescribed intermediate rounding (LlamaRMSNorm's round_x(n) before the weight), which the bound
alone cannot tell from a single rounding. The same argument makes a framework module that
follows the same pipeline (transformers' LlamaRMSNorm, GemmaRMSNorm, diffusers' RMSNorm) and
has an fp32 n within the same interval agree with the kernel bit for bit on those elements;
elsewhere the two may differ by one ulp of the rounding that is not decided. Bitwise equality
on *all* elements is not possible: the sum of squares is accumulated in another order and
PyTorch's CPU rsqrt is not the correctly rounded 1/sqrt (it differs from it for a good part of
random fp32 arguments), so the fp32 rstd differs by an ulp or two. With float32 input and weight
nothing coarser than fp32 hides that difference, so no element is decided and LlamaRMSNorm in
fp32 is compared through the bound only (most elements are bitwise equal, the others within 2
fp32 ulps); in bf16 and fp16 the output rounding hides it for all or nearly all elements.
"""

import math
from typing import Optional, Tuple

import torch

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
DTYPES = [F32, F16, BF16]
HALF_DTYPES = [F16, BF16]
U = 2.0**-24

HALF_ULP = {F32: 2.0**-24, F16: 2.0**-11, BF16: 2.0**-8}
FLOOR = {F32: 2.0**-150, F16: 2.0**-25, BF16: 2.0**-134}

# Weight kinds: the input dtype, float32 (Gemma / "weights in fp32" mixed precision), none.
WEIGHT_KINDS = ["same", "fp32", "none"]


def acc(n: int) -> float:
    return min(float(n), 8.0 * math.sqrt(n)) if n > 0 else 0.0


def rstd_error(hidden: int, exact_sum: bool = False) -> float:
    """Relative error bound of the kernel's fp32 rstd. `exact_sum`: the data make every partial
    sum of squares exact in fp32 in any order (small integers), so only /H, +eps, sqrt and the
    reciprocal round."""
    return ((0 if exact_sum else acc(hidden)) + 3) * U / 2 + 4 * U


def norm_error(hidden: int, exact_sum: bool = False) -> float:
    return rstd_error(hidden, exact_sum) + U


def make_input(shape, dtype, device, scale=3.0, seed=0, mean=0.0):
    """N(mean, scale^2) data, exactly representable in `dtype` (generated in fp32, then cast)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale + mean).to(device=device, dtype=dtype)


def make_weight(kind: str, hidden: int, dtype, device, seed=5) -> Optional[torch.Tensor]:
    """A weight around 1 (not exactly 1, so the multiply is exercised) of the kind's dtype."""
    if kind == "none":
        return None
    wdtype = dtype if kind == "same" else F32
    return make_input((hidden,), wdtype, device, scale=0.5, seed=seed, mean=1.0)


def nan_like(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def per_sample(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], *([1] * (x.dim() - 2)), t.shape[-1])


# ---- float64 parts of the reference ----


class Parts:
    """float64 pieces of y = n * w' * m + shift for one call, on the kernel's inputs.

    The values come from the kernel's own reference module (`kernel._reference`, float64
    compute); the rest (w', m, |shift|) are the magnitudes the bounds need.
    """

    def __init__(
        self, kernel, r, weight, eps, weight_offset=0.0, scale=None, shift=None, exact_sum=False
    ):
        ref = kernel._reference
        f64 = torch.float64
        r64 = r.detach().cpu().double()
        w = None if weight is None else weight.detach().cpu()
        sc = None if scale is None else scale.detach().cpu()
        sh = None if shift is None else shift.detach().cpu()
        self.hidden = r.shape[-1]
        self.e_n = norm_error(self.hidden, exact_sum)  # relative error bound of the kernel's fp32 n
        self.rstd = ref.rstd(r64, eps, compute_dtype=f64).unsqueeze(-1)
        self.n = ref.rms_norm(r64, None, eps, compute_dtype=f64)
        self.y = ref.rms_norm(
            r64, w, eps, weight_offset=weight_offset, scale=sc, shift=sh, compute_dtype=f64
        )
        self.P = ref.rms_norm(
            r64, w, eps, weight_offset=weight_offset, scale=sc, compute_dtype=f64
        ).abs()
        if w is None:
            self.w = torch.ones(self.hidden, dtype=f64)
            self.w32 = None  # no weight: no multiply in the kernel
        else:
            self.w = weight_offset + w.double()
            # w' as the kernel forms it: one fp32 add (none when the offset is 0).
            self.w32 = weight_offset + w.float() if weight_offset else w.float()
        self.m = torch.ones(1, dtype=f64) if sc is None else 1.0 + per_sample(sc.double(), r)
        self.shift = torch.zeros(1, dtype=f64) if sh is None else per_sample(sh.double(), r)


def forward_bound(parts: Parts, out_dtype, norm_dtype) -> torch.Tensor:
    h_out, f_out = HALF_ULP[out_dtype], FLOOR[out_dtype]
    h_norm, f_norm = (
        (HALF_ULP[norm_dtype], FLOOR[norm_dtype]) if norm_dtype is not None else (0.0, 0.0)
    )
    e_n = parts.e_n
    pre = (
        (h_norm + e_n + 4 * U) * parts.P
        + f_norm * (parts.w * parts.m).abs()
        + U * (parts.P + parts.shift.abs())
    )
    return h_out * parts.y.abs() + f_out + (1 + h_out) * pre


def assert_within(actual: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor, what: str) -> None:
    """|actual - ref| <= bound elementwise; NaN (e.g. an unwritten, NaN-poisoned element) fails."""
    assert tuple(actual.shape) == tuple(ref.shape), (
        f"{what}: shape {tuple(actual.shape)} != {tuple(ref.shape)}"
    )
    a = actual.detach().double().cpu()
    ref = ref.detach().double().cpu()
    bound = torch.broadcast_to(bound.detach().double().cpu(), ref.shape)
    err = (a - ref).abs()
    bad = ~(err <= bound)
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        ratio = float((err / bound.clamp_min(1e-300)).nan_to_num(float("inf")).max())
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements out of bound; first at {idx}: got "
            f"{a[idx].item()!r}, reference {ref[idx].item()!r}, error {err[idx].item():.3e} > bound "
            f"{bound[idx].item():.3e}; max error/bound {ratio:.3g}"
        )


def decided(parts: Parts, out_dtype, norm_dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """(mask, expected): elements whose kernel output the contract fixes bit for bit (docstring).

    Pipeline out = round_out(fl32(round_norm(n) * w')) for unmodulated calls.
    """
    e_n = parts.e_n

    def pipeline(n64):
        v = n64.float()  # the fp32 n at an end of the interval (rounding inward is safe: monotone)
        if norm_dtype is not None:
            v = v.to(norm_dtype).float()
        if parts.w32 is not None:
            v = v * parts.w32
        return v.to(out_dtype)

    lo, hi = pipeline(parts.n * (1 - e_n)), pipeline(parts.n * (1 + e_n))
    return lo == hi, lo  # NaN (overflow of a huge row) never counts as decided


def assert_decided(
    actual: torch.Tensor, parts: Parts, out_dtype, norm_dtype, what: str, min_fraction=None
) -> float:
    """Bitwise equality on the decided elements; returns the decided fraction.

    `min_fraction` (default: 0.5 when the first rounding of the pipeline is to a half dtype, else
    no requirement) keeps the check from being vacuous.
    """
    mask, expected = decided(parts, out_dtype, norm_dtype)
    a = actual.detach().cpu()
    assert a.dtype == out_dtype, f"{what}: dtype {a.dtype} != {out_dtype}"
    fraction = float(mask.float().mean()) if mask.numel() else 1.0
    if min_fraction is None:
        first = norm_dtype if norm_dtype is not None and norm_dtype != F32 else out_dtype
        min_fraction = 0.5 if first in HALF_DTYPES else 0.0
    assert fraction >= min_fraction, (
        f"{what}: only {fraction:.3f} of the elements are decided (the check would be vacuous)"
    )
    diff = mask & ~((a == expected) | (a.isnan() & expected.isnan()))
    if bool(diff.any()):
        idx = tuple(int(i) for i in diff.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(diff.sum())} of {int(mask.sum())} decided elements differ from the prescribed "
            f"rounding; first at {idx}: got {a[idx].item()!r}, expected {expected[idx].item()!r} "
            f"(n = {parts.n[idx].item()!r})"
        )
    return fraction


def check_forward(
    kernel,
    out,
    r,
    weight,
    eps,
    *,
    norm_dtype,
    weight_offset=0.0,
    scale=None,
    shift=None,
    exact_sum=False,
    what="",
):
    """The forward bound, and the exact check on decided elements when unmodulated."""
    parts = Parts(kernel, r, weight, eps, weight_offset, scale, shift, exact_sum)
    assert_within(out, parts.y, forward_bound(parts, out.dtype, norm_dtype), what)
    if scale is None:
        assert_decided(out, parts, out.dtype, norm_dtype, what)
    return parts


# ---- backward ----


def reference_grads(
    kernel,
    r,
    weight,
    grad_out,
    eps,
    *,
    weight_offset=0.0,
    scale=None,
    shift=None,
    grad_residual=None,
    norm_dtype="input",
):
    """float64 autograd of the exact reference at the kernel's inputs, and the bounds.

    `norm_dtype`: the dtype the forward rounded n to ("input": the input dtype, LlamaRMSNorm's
    casting; None: no rounding); the weight gradient sums grad * n' with that rounded n'.
    Returns {name: (reference gradient, bound)} for input, weight, scale, shift (those given).
    """
    hidden = r.shape[-1]
    rows = r.numel() // hidden if hidden else 0
    r64 = r.detach().double().cpu().requires_grad_()
    leaves = {"input": r64}
    w64 = s64 = sh64 = None
    if weight is not None:
        w64 = leaves["weight"] = weight.detach().double().cpu().requires_grad_()
    if scale is not None:
        s64 = leaves["scale"] = scale.detach().double().cpu().requires_grad_()
        sh64 = leaves["shift"] = shift.detach().double().cpu().requires_grad_()
    y = kernel._reference.rms_norm(
        r64,
        w64,
        eps,
        weight_offset=weight_offset,
        scale=s64,
        shift=sh64,
        compute_dtype=torch.float64,
    )
    rstd = kernel._reference.rstd(r64, eps, compute_dtype=torch.float64).unsqueeze(-1)
    n = r64 * rstd
    g = grad_out.detach().double().cpu()
    grads = torch.autograd.grad(y, list(leaves.values()), g)
    ref = dict(zip(leaves, grads))
    if grad_residual is not None:
        ref["input"] = ref["input"] + grad_residual.detach().double().cpu()

    # magnitudes (module docstring)
    with torch.no_grad():
        n, rstd = n.detach(), rstd.detach()
        wv = (
            torch.ones(hidden, dtype=torch.float64)
            if w64 is None
            else (weight_offset + w64.detach())
        )
        m = (
            torch.ones(1, dtype=torch.float64)
            if s64 is None
            else (1 + per_sample(s64.detach(), r64))
        )
        gy = g * m
        gn = gy * wv
        mean_abs = (gn * n).abs().mean(-1, keepdim=True)
        mag_gi = rstd * (gn.abs() + n.abs() * mean_abs)
        e_n, e_rstd = norm_error(hidden), rstd_error(hidden)
        in_dtype = r.dtype
        h_in, f_in = HALF_ULP[in_dtype], FLOOR[in_dtype]
        gres = 0.0 if grad_residual is None else grad_residual.detach().double().cpu().abs()
        pre = (e_rstd + e_n + (acc(hidden) + 8) * U) * mag_gi + U * (mag_gi + gres)
        bounds = {"input": h_in * ref["input"].abs() + f_in + (1 + h_in) * pre}
        if w64 is not None:
            h_w, f_w = HALF_ULP[weight.dtype], FLOOR[weight.dtype]
            # weight grads use n' (n rounded to the norm dtype), the reference n.
            nd = in_dtype if norm_dtype == "input" else norm_dtype
            mag_w = (gy * n).abs().reshape(-1, hidden).sum(0)
            h_norm = HALF_ULP[nd] if nd is not None else 0.0
            f_norm = (FLOOR[nd] if nd is not None else 0.0) * gy.abs().reshape(-1, hidden).sum(0)
            pre_w = (e_n + h_norm + (acc(rows) + 4) * U) * mag_w + f_norm
            bounds["weight"] = h_w * ref["weight"].abs() + f_w + (1 + h_w) * pre_w
        if s64 is not None:
            batch = r.shape[0]
            per = rows // batch if batch else 0
            h_s, f_s = HALF_ULP[in_dtype], FLOOR[in_dtype]
            mag_s = (g * n * wv).abs().reshape(batch, -1, hidden).sum(1).reshape(scale.shape)
            mag_sh = g.abs().reshape(batch, -1, hidden).sum(1).reshape(shift.shape)
            bounds["scale"] = (
                h_s * ref["scale"].abs() + f_s + (1 + h_s) * (e_n + (acc(per) + 4) * U) * mag_s
            )
            bounds["shift"] = (
                h_s * ref["shift"].abs() + f_s + (1 + h_s) * (acc(per) + 1) * U * mag_sh
            )
    return {k: (ref[k], bounds[k]) for k in ref}


def check_grads(kernel, actual: dict, r, weight, grad_out, eps, what="", **kwargs) -> None:
    """Each gradient in `actual` (name -> tensor) against float64 autograd of the reference."""
    expected = reference_grads(kernel, r, weight, grad_out, eps, **kwargs)
    for name, grad in actual.items():
        assert grad is not None, f"{what}: no gradient for {name}"
        ref, bound = expected[name]
        assert_within(grad, ref, bound, f"{what} grad_{name}")
