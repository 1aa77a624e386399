"""Float64 references and error bounds of the scaled GEMM tests (test_scaled_mm*.py).

The reference is the dequantized product computed in float64 from the very operands the kernel
reads. The bound on |kernel - reference| follows the arithmetic of scaled_mm_params.h:

* accumulation: int8 is exact (int32). fp8 products are exact in float32 (4-bit significands).
  With a float32 accumulator (the CPU, mma.sync on sm_89 and newer) the sum of K of them carries
  at most gamma_K = K * 2^-24 times the sum of their absolute values (Higham, Accuracy and
  Stability, 3.1; any summation order); blockwise adds one rounded scale multiply-add per
  128-block: K + K / 128 + 4 roundings in all. Hopper's fp8 tensor cores accumulate in about 14
  bits (DeepSeek-V3 report, section 3.3.2), where the worst case K * 2^-14 would exceed the
  result itself; there the bound is the probabilistic one of Higham and Mary (SIAM J. Sci.
  Comput. 2019), lambda * sqrt(K) * u with lambda = 8, which fails by chance with probability
  below 1e-13 per element.
* epilogue: (acc - zp) to float32, two scale products, the bias add and the activation, each a
  few float32 roundings (8 * 2^-24 relative to the magnitudes involved); the activations have
  slopes below 1.13 (gelu) and 1.1 (silu), so the error entering them at most doubles.
* output: one rounding to nearest, half an ulp: 2^-8 (bfloat16) or 2^-11 (float16) relative, plus
  2^-24 absolute for float16 subnormals.
"""

import torch

U32 = 2.0**-24
U_OUT = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
FP8 = torch.float8_e4m3fn
BLOCK = 128


def activate(x: torch.Tensor, activation) -> torch.Tensor:
    if activation in (None, "none"):
        return x
    if activation == "gelu":
        return torch.nn.functional.gelu(x)
    if activation == "gelu_tanh":
        return torch.nn.functional.gelu(x, approximate="tanh")
    if activation == "silu":
        return torch.nn.functional.silu(x)
    raise ValueError(activation)


def per_row(scale: torch.Tensor, rows: int) -> torch.Tensor:
    """A per-tensor or per-row scale as a float64 column of `rows` entries."""
    s = scale.detach().cpu().double().reshape(-1)
    return (s.expand(rows) if s.numel() == 1 else s).reshape(rows, 1)


def reference(
    a, b, scale_a, scale_b, *, bias=None, activation=None, azp_adj=None, azp=None, blockwise=False
):
    """(reference, magnitude of the terms summed, value before the activation), float64 [M, N].
    blockwise: scale_a [M, K / 128] and scale_b [K / 128, ceil(N / 128)]."""
    A, B = a.cpu().double(), b.cpu().double()
    m = A.shape[0]
    n = B.shape[1]
    if blockwise:
        sa = scale_a.cpu().double().repeat_interleave(BLOCK, dim=1)  # [M, K]
        sb = scale_b.cpu().double().repeat_interleave(BLOCK, dim=0)  # [K, nb * 128]
        sb = sb.repeat_interleave(BLOCK, dim=1)[:, :n]
        pre = (A * sa) @ (B * sb)
        magnitude = (A * sa).abs() @ (B * sb).abs()
    else:
        scale = per_row(scale_a, m) * per_row(scale_b, n).reshape(1, n)
        dot = A @ B
        if azp_adj is not None:
            adj = azp_adj.cpu().double().reshape(1, n)
            dot = dot - (adj if azp is None else azp.cpu().double().reshape(m, 1) * adj)
        pre = scale * dot
        magnitude = scale * (A.abs() @ B.abs())
    if bias is not None:
        pre = pre + bias.cpu().double().reshape(1, n)
    return activate(pre, activation), magnitude, pre


def bound(ref, magnitude, pre, *, k, out_dtype, fp8, blockwise=False, coarse_accumulator=False):
    """Largest |kernel - reference| the arithmetic allows (module docstring). coarse_accumulator:
    fp8 on Hopper tensor cores (14-bit accumulation)."""
    roundings = k + (k // BLOCK if blockwise else 0) + 4
    if not fp8:
        accumulation = 0.0
    elif coarse_accumulator:
        accumulation = 8 * roundings**0.5 * 2.0**-14
    else:
        accumulation = roundings * U32
    before = accumulation * magnitude + 8 * U32 * (pre.abs() + magnitude)
    err = 2 * before + 8 * U32 * ref.abs()
    u = U_OUT[out_dtype]
    return u * ref.abs() + (1 + u) * err + 2.0**-24


def assert_close(got, ref, tol):
    diff = (got.cpu().double() - ref).abs()
    assert not got.isnan().any(), "NaN in the output (an element left unwritten?)"
    worst = (diff / tol).max().item() if diff.numel() else 0.0
    assert worst <= 1.0, f"error {worst:.3g}x the derived bound (max abs error {diff.max():.3g})"
