"""Run every CUDA quant kernel once on odd shapes, for compute-sanitizer.

    compute-sanitizer --tool memcheck --error-exitcode 9 python quant/tests/sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 9 python quant/tests/sanitize.py

    compute-sanitizer --tool memcheck --error-exitcode 9 python quant/tests/sanitize.py --int4-only

Each tensor is an exact-size allocation (PyTorch's caching allocator is switched off), so a read
or write past a row, a scale vector or the output leaves its allocation and memcheck reports it.
The shapes put M, N and K off every tile size: partial tiles in both modes, the swapped decode
tiles, the blockwise scale rows that need padding. Both GEMM families run: the Hopper kernels
(path "auto" on an H100 / H200) and the mma.sync ones (path "sm80"). Not collected by pytest
(no test_ prefix).
"""

import os
import sys
from pathlib import Path

# Before CUDA starts: every tensor its own cudaMalloc, so memcheck sees a tensor's exact end.
os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")

import kernels  # noqa: E402
import torch  # noqa: E402

FP8 = torch.float8_e4m3fn
# (M, N, K): decode, a swapped tile's edge, the half-width M <= 128 tiles, partial 128 x 128
# tiles, a large-M tile edge.
SHAPES = [(1, 48, 208), (17, 208, 400), (97, 1040, 208), (129, 400, 256), (2049, 272, 384)]


def operands(m: int, n: int, k: int, dtype: torch.dtype):
    if dtype == FP8:
        a = torch.randn(m, k, device="cuda").to(FP8)
        w = torch.randn(n, k, device="cuda").to(FP8)
    else:
        a = torch.randint(-100, 100, (m, k), device="cuda", dtype=torch.int8)
        w = torch.randint(-100, 100, (n, k), device="cuda", dtype=torch.int8)
    return a, w.t()


def run_gemms(quant) -> None:
    for m, n, k in SHAPES:
        for dtype in (FP8, torch.int8):
            a, b = operands(m, n, k, dtype)
            scale_a = torch.rand(m, 1, device="cuda") + 0.5
            scale_b = torch.rand(1, n, device="cuda") + 0.5
            one = torch.ones(1, device="cuda")
            bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            quant.cutlass_scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias)
            quant.cutlass_scaled_mm(a, b, one, one, torch.float16, activation="silu")
            if dtype == torch.int8:
                adj = b.to(torch.int32).sum(0, dtype=torch.int32)
                azp = torch.randint(-8, 8, (m,), device="cuda", dtype=torch.int32)
                quant.cutlass_scaled_mm_azp(a, b, scale_a, scale_b, torch.bfloat16, adj, azp, bias)
            elif k % 128 == 0 and torch.cuda.get_device_capability() == (9, 0):
                block_a = torch.rand(m, k // 128, device="cuda") + 0.5
                block_b = torch.rand(k // 128, (n + 127) // 128, device="cuda") + 0.5
                quant.cutlass_scaled_mm(a, b, block_a, block_b, torch.bfloat16, bias)


def run_quantize_ops(quant) -> None:
    for rows, hidden in ((1, 200), (33, 4104), (257, 136)):
        x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
        quant.scaled_fp8_quant(x)
        quant.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
        quant.scaled_fp8_quant(x, torch.tensor([0.05], device="cuda"))
        quant.scaled_int8_quant(x)
        quant.scaled_int8_quant(x, symmetric=False)
        quant.scaled_int8_quant(x, torch.tensor([0.05], device="cuda"))
        if hidden % 8 == 0:
            quant.per_token_group_quant_fp8(x, 8)


# int4 (M, K, N, group size): both main loops (M <= 8 plain streams through registers, 16-token
# tiles and the gated form through the shared-memory ring), split K (N of one tile, long K, splits
# that start inside a group), partial token tiles, groups of 16 to 128.
INT4_SHAPES = [
    (1, 2048, 64, 128),
    (1, 1104, 64, 48),
    (5, 400, 192, 16),
    (12, 1024, 128, 64),
    (40, 208, 256, 16),
]


def run_int4(quant) -> None:
    for m, k, n, group in INT4_SHAPES:
        for dtype in (torch.bfloat16, torch.float16):
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            codes = torch.randint(0, 16, (k, n), device="cuda", dtype=torch.uint8)
            w = quant.int4_pack(codes)
            scales = (torch.rand(k // group, n, device="cuda") * 0.01 + 1e-3).to(dtype)
            zeros = torch.randint(0, 16, (k // group, n), device="cuda").to(dtype)
            bias = torch.randn(n, device="cuda", dtype=dtype)
            quant.w4a16_gemm(a, w, scales)
            quant.w4a16_gemm(a, w, scales, zeros, bias=bias, activation="gelu")
            if n % 128 == 0:
                quant.w4a16_gemm_gated(a, w, scales, zeros, bias=bias)
            quant.int4_unpack(w)


def main() -> None:
    quant = kernels.get_local_kernel(
        Path(__file__).resolve().parent.parent / "build", backend="cuda"
    )
    torch.manual_seed(0)
    run_int4(quant)
    if "--int4-only" in sys.argv:
        torch.cuda.synchronize()
        print("quant sanitize: the int4 kernels ran")
        return
    run_quantize_ops(quant)
    for path in ("auto", "sm80"):
        quant.ops._set_scaled_mm_path(path)
        run_gemms(quant)
    quant.ops._set_scaled_mm_path("auto")
    torch.cuda.synchronize()
    print("quant sanitize: every kernel ran")


if __name__ == "__main__":
    main()
