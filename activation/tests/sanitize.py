"""Run every CUDA op of the built kernel once on awkward shapes, for compute-sanitizer.

    compute-sanitizer --tool memcheck --error-exitcode 9 python activation/tests/sanitize.py

Shapes cover the vector path, the scalar tail, misaligned row strides, views into wider buffers,
one token and empty inputs. Outputs are exact-size allocations, so any write past the end of a
row or tensor is reported by memcheck. Not collected by pytest (no test_ prefix).
"""

from pathlib import Path

import kernels
import torch

KERNEL = kernels.get_local_kernel(Path(__file__).resolve().parent.parent / "build", backend="cuda")

GATED = [
    "silu_and_mul",
    "mul_and_silu",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "fatrelu_and_mul",
    "swigluoai_and_mul",
]
UNARY = ["silu", "gelu", "gelu_tanh", "gelu_fast", "gelu_new", "gelu_quick"]


def inputs(dtype):
    """(input, out-shape maker) pairs: contiguous, strided views, odd widths, one row, empty."""
    for rows, width in [(1, 16), (3, 2 * 4097), (7, 2 * 13), (5, 2 * 8), (2, 2 * 14336), (0, 64)]:
        yield torch.randn(rows, width, dtype=dtype, device="cuda")
        wide = torch.randn(rows, width + 6, dtype=dtype, device="cuda")
        yield wide[:, 3 : 3 + width]  # row stride not a multiple of the vector width
    yield torch.randn(2, 3, 2 * 96, dtype=dtype, device="cuda")


def main():
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
        for x in inputs(dtype):
            for op in GATED + UNARY:
                width = x.shape[-1] // 2 if op in GATED else x.shape[-1]
                out = torch.empty(*x.shape[:-1], width, dtype=dtype, device="cuda")
                getattr(KERNEL, op)(out, x)
                grad_out = torch.randn_like(out)
                grad_in = torch.empty_like(x)
                getattr(KERNEL.ops, op + "_bwd")(grad_in, grad_out, x)
    torch.cuda.synchronize()
    print("sanitize: all ops ran")


if __name__ == "__main__":
    main()
