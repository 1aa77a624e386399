"""Shared test data, float64 references and the tolerance model of the rope tests (no kernel code).

Imported by the test modules (pytest puts this directory on sys.path). The references below are
written here, independently of the package's own reference module, from the formulas of each
calling convention (vLLM / sgl cos_sin_cache, flash-attn cos/sin halves, transformers'
rotate_half, diffusers' LTX-Video interleaved pairs) and from kernel_src/rope_params.h:

    pairs (a_i, b_i), i < rot_dim / 2:  NeoX  a_i = x[i],   b_i = x[i + rot_dim / 2]
                                        GPT-J a_i = x[2i],  b_i = x[2i + 1]
    forward:    a' = a ca - b sa        b' = b cb + a sb
    transpose:  a' = a ca + b sb        b' = b cb - a sa      (flash-attn `conjugate`, the backward)

with per-channel coefficients (ca = cos[c(a_i)], cb = cos[c(b_i)]; a half table gives
ca = cb = cos[i]); channels [rot_dim, head_dim) pass through unchanged. The references evaluate
this in float64 on the kernel's own inputs (activations *and* cos/sin tables exactly as passed,
so a bf16 table is no error source: its rounding happened before the call, to both sides alike).

Tolerance model
---------------
u = 2**-24 (fp32 unit roundoff); h_T = half an ulp of dtype T, relative (2**-(m+1), m explicit
mantissa bits); f_T = half the smallest subnormal of T (absolute floor of one rounding to T).

| dtype    | h_T               | f_T     |
|----------|-------------------|---------|
| float32  | 2**-24 = 6.0e-8   | 2**-150 |
| float16  | 2**-11 = 4.9e-4   | 2**-25  |
| bfloat16 | 2**-8  = 3.9e-3   | 2**-134 |

Forward. The contract prescribes fp32 math rounded once to the output dtype. An output element is
p1 -+ p2 (two products of exactly representable fp32 values: inputs and table entries widen to
fp32 exactly). Evaluated in fp32 (two rounded products and a rounded add, or an FMA and one
product) its error is at most u (|p1| + |p2|) + u (1 + u) (|p1| + |p2|) <= 3u * mag with
mag = |p1| + |p2| (the "magnitude", computed by the same reference on absolute values; the
difference may cancel, so the bound is relative to the terms, not to the result). The final
rounding adds half an ulp of the result:

    |out - ref| <= h_T |ref| + f_T + (1 + h_T) * 3u * mag

For bf16 that is about 2**-8 relative (one rounding of an fp32 result); nothing is fitted to
measurements. Pass-through channels must be copied bit for bit (out of place) or left untouched
(in place), and every element outside the rotated views (v of a fused qkv, padding) must keep
its bits.

Exact ("decided") elements. Rounding fp32 -> T is monotone, so the kernel's output is
round_T(v) for some fp32 v in [ref - 3u mag, ref + 3u mag]. Where both ends of that interval
round to the same value of T, the kernel's output must equal it bit for bit; for half dtypes most
elements are decided (the check requires at least half of them, so it is never vacuous). This
is what tells a single rounding from the double rounding (products rounded to bf16 first) of
the eager transformers formula, which the bound alone cannot. The same argument makes diffusers'
LTX-Video formula (fp32 math, rounded once) agree with the kernel bit for bit on those elements.

Reductions (backward w.r.t. a table that is broadcast over heads / batch): a sum of N products
in fp32 has an error of at most (acc(N) + 1) u * mag, mag = the sum of |terms|, with
acc(N) = min(N, 8 sqrt(N)) (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed.,
section 4.2, worst case N; Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019, Theorem 2.4 with
lambda = 8, probabilistic, failure probability ~1e-14 per sum). A gradient w.r.t. x is a sum of
two products (N = 2: 3u, the forward's constant).

Frameworks that round intermediate products (transformers' apply_rotary_pos_emb in the
activation dtype: q*cos, rotate_half(q)*sin and their sum each rounded to T) have the bound
`eager_bound`: |tf - ref| <= h_T (mag + |ref|) (1 + h_T) + 3 f_T; agreement with the kernel is
checked as |ours - tf| <= bound(ours) + eager_bound(tf).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
DTYPES = [F32, F16, BF16]
HALF_DTYPES = [F16, BF16]
U = 2.0**-24
HALF_ULP = {F32: 2.0**-24, F16: 2.0**-11, BF16: 2.0**-8}
FLOOR = {F32: 2.0**-150, F16: 2.0**-25, BF16: 2.0**-134}
COMPUTE = 3 * U  # fp32 evaluation of p1 -+ p2 (module docstring)

# Head sizes: the real ones (64 … 256) and small even ones that are not a multiple of any
# vector width (6, 34). (head_size, rot_dim): rot_dim == head_size, or partial rotary.
HEAD_CASES = [
    (64, 64),
    (80, 80),
    (96, 96),
    (128, 128),
    (256, 256),
    (6, 6),
    (34, 34),
    (128, 64),
    (80, 32),
    (34, 18),
    (6, 2),
]


def head_id(case) -> str:
    d, r = case
    return f"D{d}" if d == r else f"D{d}r{r}"


def dtype_id(dtype) -> str:
    return str(dtype).replace("torch.", "")


def acc(n: int) -> float:
    return min(float(n), 8.0 * math.sqrt(n)) if n > 0 else 0.0


# ---- inputs ----


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make_input(shape, dtype, device, scale=1.0, seed=0):
    """N(0, scale^2) data, exactly representable in `dtype` (generated in fp32 on the CPU, then
    cast: the same values on every device)."""
    return (torch.randn(shape, generator=generator(seed)) * scale).to(device=device, dtype=dtype)


def nan_like(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def angles(rows: int, half: int, base: float = 10000.0, seed: int = 0, random: bool = True):
    """[rows, half] float64 angles: the usual inverse-frequency grid t * base^(-2i/rot), plus
    (random=True) a random phase per row so that no row is special (row 0 is not the identity)."""
    inv_freq = base ** (-torch.arange(half, dtype=F64) * 2.0 / max(2 * half, 1))
    t = torch.arange(rows, dtype=F64)
    theta = t[:, None] * inv_freq[None, :]
    if random:
        theta = theta + torch.rand(rows, half, generator=generator(seed), dtype=F64) * 2 * math.pi
    return theta


def make_cos_sin_cache(max_pos, rot_dim, dtype, device, seed=0):
    """vLLM's cos_sin_cache [max_pos, rot_dim] = cat(cos, sin) of the angle grid, in `dtype`."""
    theta = angles(max_pos, rot_dim // 2, seed=seed)
    return torch.cat([theta.cos(), theta.sin()], dim=-1).to(device=device, dtype=dtype)


def make_cos_sin(rows, half, dtype, device, seed=0):
    """flash-attn's cos, sin [rows, half] in `dtype`."""
    theta = angles(rows, half, seed=seed)
    return theta.cos().to(device=device, dtype=dtype), theta.sin().to(device=device, dtype=dtype)


def make_positions(shape, max_pos, dtype, device, seed=0):
    return torch.randint(0, max_pos, shape, generator=generator(seed)).to(
        device=device, dtype=dtype
    )


def table_dtype(kind: str, dtype):
    """cos/sin table dtype: "fp32" or "same" (the activation dtype)."""
    return F32 if kind == "fp32" else dtype


# ---- the float64 reference of rope_params.h ----


def pair_channels(rot_dim: int, interleaved: bool):
    """(channels of a_i, channels of b_i), i < rot_dim / 2."""
    half = rot_dim // 2
    i = torch.arange(half)
    if interleaved:
        return 2 * i, 2 * i + 1
    return i, i + half


def expand_half(table: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """A half table [..., rot/2] (one coefficient per pair) as a per-channel one [..., rot]."""
    if interleaved:
        return table.repeat_interleave(2, dim=-1)
    return torch.cat([table, table], dim=-1)


def rotate(
    x, cos, sin, rot_dim: int, interleaved: bool, transpose: bool = False, magnitude: bool = False
):
    """float64 rotation of the first rot_dim channels of x [..., D] with per-channel cos/sin
    [..., rot_dim] (broadcast against x[..., :rot_dim]); the other channels pass through.

    magnitude=True: |a ca| + |b sa| (etc.) instead, the error scale of the fp32 evaluation (call
    it with absolute values; pass-through channels get 0: they are copied exactly). Differentiable
    (autograd gives the float64 backward; on magnitude=True it gives the backward's magnitudes).
    """
    ia, ib = pair_channels(rot_dim, interleaved)
    a, b = x[..., ia], x[..., ib]
    ca, cb, sa, sb = cos[..., ia], cos[..., ib], sin[..., ia], sin[..., ib]
    if magnitude:
        na = a * ca + b * (sb if transpose else sa)
        nb = b * cb + a * (sa if transpose else sb)
    elif transpose:
        na = a * ca + b * sb
        nb = b * cb - a * sa
    else:
        na = a * ca - b * sa
        nb = b * cb + a * sb
    parts = torch.stack([na, nb], dim=-1)  # [..., half, 2]: (a'_i, b'_i), back to their channels
    if interleaved:
        rotated = parts.flatten(-2)
    else:
        rotated = torch.cat([parts[..., 0], parts[..., 1]], dim=-1)
    rest = x[..., rot_dim:]
    if magnitude:
        rest = torch.zeros_like(rest)
    rest = rest.expand(rotated.shape[:-1] + rest.shape[-1:])
    return torch.cat([rotated, rest], dim=-1)


class Ref:
    """A float64 reference value and its error magnitude (see the module docstring)."""

    def __init__(self, value: torch.Tensor, mag: torch.Tensor):
        self.value, self.mag = value, mag


def _f64(t):
    return t.detach().to("cpu", F64)


def ref_rotate(x, cos_full, sin_full, rot_dim, interleaved, transpose=False) -> Ref:
    """Ref of `rotate` on the kernel's inputs (any device / dtype, moved to float64 CPU)."""
    x, c, s = _f64(x), _f64(cos_full), _f64(sin_full)
    return Ref(
        rotate(x, c, s, rot_dim, interleaved, transpose),
        rotate(x.abs(), c.abs(), s.abs(), rot_dim, interleaved, transpose, magnitude=True),
    )


def ref_vllm(positions, x, head_size, cos_sin_cache, is_neox, offsets=None) -> Ref:
    """vLLM rotary_embedding on one of query/key: x [..., H * D] or [..., H, D] with
    positions of shape x.shape[:-1] (resp. [:-2]); row = positions (+ offsets); the cache row is
    cat(cos, sin), one coefficient per pair."""
    rot = cos_sin_cache.shape[-1]
    rows = positions.detach().cpu().long()
    if offsets is not None:
        rows = rows + offsets.detach().cpu().long()
    cache = _f64(cos_sin_cache)
    cos = expand_half(cache[rows, : rot // 2], not is_neox).unsqueeze(-2)  # [..., 1, rot]
    sin = expand_half(cache[rows, rot // 2 :], not is_neox).unsqueeze(-2)
    heads = x.shape[-1] // head_size if x.dim() == rows.dim() + 1 else x.shape[-2]
    xs = x.reshape(*rows.shape, heads, head_size)
    r = ref_rotate(xs, cos, sin, rot, not is_neox)
    return Ref(r.value.reshape(x.shape), r.mag.reshape(x.shape))


def sequence_rows(batch, seqlen, seqlen_offsets=0):
    """flash-attn padded batches: row[b, s] = s + offset (int or [batch] tensor)."""
    rows = torch.arange(seqlen).expand(batch, seqlen)
    if isinstance(seqlen_offsets, torch.Tensor):
        return rows + seqlen_offsets.detach().cpu().long()[:, None]
    return rows + int(seqlen_offsets)


def varlen_rows(cu_seqlens, seqlen_offsets=0, total=None):
    """flash-attn varlen: row[t] = t - cu[q] + offset_q for the sequence q of token t."""
    cu = cu_seqlens.detach().cpu().long()
    total = int(cu[-1]) if total is None else total
    rows = torch.empty(total, dtype=torch.long)
    for q in range(cu.numel() - 1):
        lo, hi = int(cu[q]), int(cu[q + 1])
        off = (
            int(seqlen_offsets[q])
            if isinstance(seqlen_offsets, torch.Tensor)
            else int(seqlen_offsets)
        )
        rows[lo:hi] = torch.arange(hi - lo) + off
    return rows


def ref_flash(
    x, cos, sin, interleaved=False, seqlen_offsets=0, cu_seqlens=None, conjugate=False
) -> Ref:
    """flash-attn apply_rotary_emb: x [B, S, H, D] (or [total, H, D] with cu_seqlens),
    cos/sin [seqlen_ro, rot/2]; rot = 2 * cos.shape[-1]."""
    rot = 2 * cos.shape[-1]
    if cu_seqlens is None:
        rows = sequence_rows(x.shape[0], x.shape[1], seqlen_offsets)
    else:
        rows = varlen_rows(cu_seqlens, seqlen_offsets, x.shape[0])
    c = expand_half(_f64(cos)[rows], interleaved).unsqueeze(-2)
    s = expand_half(_f64(sin)[rows], interleaved).unsqueeze(-2)
    return ref_rotate(x, c, s, rot, interleaved, transpose=conjugate)


def rotate_half(x):
    """transformers' rotate_half."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def transformers_formula(q, cos, sin, unsqueeze_dim=1, magnitude=False):
    """q * cos + rotate_half(q) * sin with cos/sin [B or 1, S, D] unsqueezed at unsqueeze_dim
    (written here as transformers writes it; float64 when given float64)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    if magnitude:
        return q.abs() * cos.abs() + rotate_half(q).abs() * sin.abs()
    return q * cos + rotate_half(q) * sin


def ref_transformers(q, cos, sin, unsqueeze_dim=1) -> Ref:
    q, c, s = _f64(q), _f64(cos), _f64(sin)
    return Ref(
        transformers_formula(q, c, s, unsqueeze_dim),
        transformers_formula(q, c, s, unsqueeze_dim, magnitude=True),
    )


def ltx_formula(x, cos, sin, magnitude=False):
    """diffusers' LTX-Video apply_rotary_emb in float64: x [B, S, C], interleaved pairs over C,
    cos/sin [B or 1, S, C] per channel."""
    x_real, x_imag = x.unflatten(2, (-1, 2)).unbind(-1)
    if magnitude:
        x_rotated = torch.stack([x_imag.abs(), x_real.abs()], dim=-1).flatten(2)
        return x.abs() * cos.abs() + x_rotated * sin.abs()
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(2)
    return x * cos + x_rotated * sin


def ref_ltx(x, cos, sin) -> Ref:
    x, c, s = _f64(x), _f64(cos), _f64(sin)
    return Ref(ltx_formula(x, c, s), ltx_formula(x, c, s, magnitude=True))


# ---- checks ----


def bound(ref: Ref, dtype, compute: float = COMPUTE) -> torch.Tensor:
    h, f = HALF_ULP[dtype], FLOOR[dtype]
    return h * ref.value.abs() + f + (1 + h) * compute * ref.mag


def eager_bound(ref: Ref, dtype) -> torch.Tensor:
    """Bound of a formula evaluated op by op in `dtype` (two rounded products, a rounded sum),
    e.g. transformers' apply_rotary_pos_emb: h (|p1| + |p2|) + h |fl(p1) + fl(p2)| + 3 f."""
    h, f = HALF_ULP[dtype], FLOOR[dtype]
    return (1 + h) * h * (ref.mag + ref.value.abs()) + 3 * f


def assert_within(actual: torch.Tensor, ref: torch.Tensor, bnd: torch.Tensor, what: str) -> None:
    """|actual - ref| <= bound elementwise; NaN (an unwritten, NaN-poisoned element) fails."""
    assert tuple(actual.shape) == tuple(ref.shape), (
        f"{what}: shape {tuple(actual.shape)} != {tuple(ref.shape)}"
    )
    a = actual.detach().to("cpu", F64)
    ref = ref.detach().to("cpu", F64)
    bnd = torch.broadcast_to(bnd.detach().to("cpu", F64), ref.shape)
    err = (a - ref).abs()
    bad = ~(err <= bnd)
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        ratio = float((err / bnd.clamp_min(1e-300)).nan_to_num(float("inf")).max())
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements out of bound; first at {idx}: got "
            f"{a[idx].item()!r}, reference {ref[idx].item()!r}, error {err[idx].item():.3e} > bound "
            f"{bnd[idx].item():.3e}; max error/bound {ratio:.3g}"
        )


def decided(ref: Ref, dtype, compute: float = COMPUTE):
    """(mask, expected): elements whose output the single fp32 rounding fixes bit for bit."""
    e = (
        compute * ref.mag * (1 + 2.0**-40)
    )  # the margin covers the float64 evaluation's own rounding
    lo = (ref.value - e).float().to(dtype)
    hi = (ref.value + e).float().to(dtype)
    return lo == hi, lo


def assert_decided(
    actual: torch.Tensor, ref: Ref, what: str, min_fraction: Optional[float] = None
) -> float:
    """Bitwise equality on the decided elements (module docstring); returns their fraction.
    `min_fraction` (default 0.5 for half dtypes, else 0) keeps the check from being vacuous."""
    dtype = actual.dtype
    mask, expected = decided(ref, dtype)
    a = actual.detach().cpu()
    fraction = float(mask.float().mean()) if mask.numel() else 1.0
    if min_fraction is None:
        min_fraction = 0.5 if dtype in HALF_DTYPES else 0.0
    assert fraction >= min_fraction, (
        f"{what}: only {fraction:.3f} of the elements are decided (vacuous check)"
    )
    diff = mask & (a != expected)
    if bool(diff.any()):
        idx = tuple(int(i) for i in diff.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(diff.sum())} of {int(mask.sum())} decided elements differ from the single "
            f"rounding of the exact value; first at {idx}: got {a[idx].item()!r}, expected "
            f"{expected[idx].item()!r} (exact {ref.value[idx].item()!r})"
        )
    return fraction


def check(actual: torch.Tensor, ref: Ref, what: str, *, exact: bool = True) -> None:
    """The bound, and (exact=True) bit-for-bit equality on the decided elements."""
    assert_within(actual, ref.value, bound(ref, actual.dtype), what)
    if exact:
        assert_decided(actual, ref, what)


def check_pass_through(
    actual: torch.Tensor, original: torch.Tensor, rot_dim: int, head_size: int, what: str
):
    """Channels [rot_dim, head_size) of every head equal the input bit for bit."""
    if rot_dim == head_size:
        return
    a = actual.detach().reshape(-1, head_size)[:, rot_dim:]
    o = original.detach().reshape(-1, head_size)[:, rot_dim:].to(a.device)
    assert torch.equal(a, o), f"{what}: pass-through channels changed"


# ---- backward ----


def check_grads(
    actual: dict,
    fn,
    inputs: dict,
    grad_outs: Sequence[torch.Tensor],
    terms: Optional[dict] = None,
    what: str = "",
) -> None:
    """Each gradient in `actual` (name -> tensor) against float64 autograd of `fn`.

    fn(magnitude, **inputs) returns a tuple of outputs, float64 and differentiable; with
    magnitude=True it must return the outputs' magnitudes (absolute values of every term) and be
    linear in each input's absolute value, so that its autograd, fed |grad_out| at |inputs|,
    gives the magnitude of each gradient element (the sum of |terms|). `terms[name]`: how many
    products the kernel sums for one element of that gradient (default 2, the transpose rotation).
    Bound: h |ref| + f + (1 + h) (acc(N) + 1) u mag in the gradient's dtype.
    """
    terms = terms or {}
    names = list(actual)
    x64 = {k: _f64(v).requires_grad_(k in names) for k, v in inputs.items()}
    g64 = [_f64(g) for g in grad_outs]
    outs = fn(False, **x64)
    refs = torch.autograd.grad(outs, [x64[n] for n in names], g64, allow_unused=True)
    a64 = {k: _f64(v).abs().requires_grad_(k in names) for k, v in inputs.items()}
    mags = torch.autograd.grad(
        fn(True, **a64), [a64[n] for n in names], [g.abs() for g in g64], allow_unused=True
    )
    for name, ref, mag in zip(names, refs, mags):
        got = actual[name]
        assert got is not None, f"{what}: no gradient for {name}"
        assert got.dtype == inputs[name].dtype, (
            f"{what}: grad_{name} dtype {got.dtype} != {inputs[name].dtype}"
        )
        ref = torch.zeros_like(x64[name]) if ref is None else ref
        mag = torch.zeros_like(x64[name]) if mag is None else mag
        n = terms.get(name, 2)
        r = Ref(ref, mag)
        assert_within(
            got, ref, bound(r, got.dtype, compute=(acc(n) + 1) * U), f"{what} grad_{name}"
        )
