"""Bad calls of the scaled GEMMs raise errors that name the function called and the argument,
and say what was expected: every check of torch-ext/scaled_mm_ops.cpp and of the wrappers."""

import pytest
import torch

FP8 = torch.float8_e4m3fn
M, N, K = 4, 32, 64


def raises(exc, match):
    return pytest.raises(exc, match=match)


@pytest.fixture
def args(device):
    """Valid int8 operands: a [M, K], b [K, N] column-major, per-token and per-channel scales."""
    a = torch.ones(M, K, dtype=torch.int8, device=device)
    b = torch.ones(N, K, dtype=torch.int8, device=device).t()
    sa = torch.ones(M, 1, device=device)
    sb = torch.ones(N, device=device)
    return a, b, sa, sb


def out(device, dtype=torch.bfloat16, shape=(M, N)):
    return torch.empty(shape, dtype=dtype, device=device)


@pytest.mark.kernels_ci
def test_operand_dtypes_and_shapes(kernel, device, args):
    a, b, sa, sb = args
    mm = kernel.cutlass_scaled_mm
    with raises(RuntimeError, r"^cutlass_scaled_mm: a and b must both be float8_e4m3fn or both "):
        mm(a.float().to(FP8), b, sa, sb, torch.bfloat16)
    with raises(RuntimeError, r"^cutlass_scaled_mm: a and b must both .*got float32 and int8"):
        mm(a.float(), b, sa, sb, torch.bfloat16)
    with raises(ValueError, r"^cutlass_scaled_mm: a must be 2-D \[M, K\], got shape \[64\]"):
        mm(a[0], b, sa, sb, torch.bfloat16)
    with raises(ValueError, r"^cutlass_scaled_mm: b must be 2-D \[K, N\]"):
        mm(a, b[:, 0], sa, sb, torch.bfloat16)
    with raises(
        RuntimeError, r"^cutlass_scaled_mm: b must have K = 64 rows .*got shape \[48, 32\]"
    ):
        mm(a, b[:48], sa, sb, torch.bfloat16)
    with raises(RuntimeError, r"^cutlass_scaled_mm: K must be a positive multiple of 16, got 40"):
        mm(a[:, :40], b[:40], sa, sb, torch.bfloat16)
    with raises(RuntimeError, r"^cutlass_scaled_mm: N must be a positive multiple of 16, got 24"):
        mm(a, b[:, :24], sa, sb[:24], torch.bfloat16)
    with raises(TypeError, r"^cutlass_scaled_mm: a must be a tensor, got list"):
        mm([[1]], b, sa, sb, torch.bfloat16)


@pytest.mark.kernels_ci
def test_operand_layouts(kernel, device, args):
    a, b, sa, sb = args
    mm = kernel.cutlass_scaled_mm
    column_major_a = torch.ones(K, M, dtype=torch.int8, device=device).t()
    with raises(RuntimeError, r"^cutlass_scaled_mm: a must be row-major \[M, K\] \(unit stride"):
        mm(column_major_a, b, sa, sb, torch.bfloat16)
    row_major_b = torch.ones(K, N, dtype=torch.int8, device=device)
    with raises(RuntimeError, r"^cutlass_scaled_mm: b must be column-major \[K, N\] \(stride"):
        mm(a, row_major_b, sa, sb, torch.bfloat16)
    padded = torch.ones(M, K + 8, dtype=torch.int8, device=device)[:, :K]
    with raises(RuntimeError, r"^cutlass_scaled_mm: a's row stride must be a multiple of 16 .*72"):
        mm(padded, b, sa, sb, torch.bfloat16)
    padded_b = torch.ones(N, K + 8, dtype=torch.int8, device=device)[:, :K].t()
    with raises(RuntimeError, r"^cutlass_scaled_mm: b's column stride must be a multiple of 16"):
        mm(a, padded_b, sa, sb, torch.bfloat16)
    shifted = torch.ones(M * K + 1, dtype=torch.int8, device=device)[1:].view(M, K)
    with raises(RuntimeError, r"^cutlass_scaled_mm: a and b must start on a 16-byte boundary"):
        mm(shifted, b, sa, sb, torch.bfloat16)


@pytest.mark.kernels_ci
def test_out(kernel, device, args):
    a, b, sa, sb = args
    raw = kernel.ops.cutlass_scaled_mm
    with raises(ValueError, r"^cutlass_scaled_mm: out_dtype must be torch.float16 or torch.bf"):
        kernel.cutlass_scaled_mm(a, b, sa, sb, torch.float32)
    with raises(RuntimeError, r"^cutlass_scaled_mm: out must be float16 or bfloat16, got float32"):
        raw(out(device, torch.float32), a, b, sa, sb, None)
    with raises(
        RuntimeError, r"^cutlass_scaled_mm: out must have shape \[4, 32\] \(\[M, N\]\), got"
    ):
        raw(out(device, shape=(M, 48)), a, b, sa, sb, None)
    with raises(RuntimeError, r"^cutlass_scaled_mm: out must have unit stride along N"):
        raw(out(device, shape=(N, M)).t(), a, b, sa, sb, None)
    with raises(RuntimeError, r"^cutlass_scaled_mm: out's row stride must be a multiple of 8 .*36"):
        raw(out(device, shape=(M, N + 4))[:, :N], a, b, sa, sb, None)
    shifted = out(device, shape=(M * N + 8,))[4 : 4 + M * N].view(M, N)  # 8 bytes in
    with raises(RuntimeError, r"^cutlass_scaled_mm: out must start on a 16-byte boundary"):
        raw(shifted, a, b, sa, sb, None)
    buffer = torch.zeros(2 * M * K, dtype=torch.int8, device=device)
    overlapping = buffer.view(torch.bfloat16)[: M * N].view(M, N)
    with raises(RuntimeError, r"^cutlass_scaled_mm: out must not share memory with a"):
        raw(overlapping, buffer[: M * K].view(M, K), b, sa, sb, None)
    floats = torch.zeros(M * N, device=device)
    overlapping = floats.view(torch.bfloat16)[: M * N].view(M, N)
    with raises(RuntimeError, r"^cutlass_scaled_mm: out must not share memory with a_scales"):
        raw(overlapping, a, b, floats[:M], sb, None)


@pytest.mark.kernels_ci
def test_scales_and_bias(kernel, device, args):
    a, b, sa, sb = args
    mm = kernel.cutlass_scaled_mm
    with raises(RuntimeError, r"^cutlass_scaled_mm: a_scales must be float32, got float16"):
        mm(a, b, sa.half(), sb, torch.bfloat16)
    strided = torch.ones(M, 2, device=device)[:, :1]
    with raises(RuntimeError, r"^cutlass_scaled_mm: a_scales must be contiguous, got strides"):
        mm(a, b, strided, sb, torch.bfloat16)
    with raises(
        RuntimeError,
        r"^cutlass_scaled_mm: scales of shapes \[4, 3\] and \[32\] match no scale mode .*"
        r"\(accepted: a_scales with 1 element \(per tensor\) or M",
    ):
        mm(a, b, torch.ones(M, 3, device=device), sb, torch.bfloat16)
    with raises(RuntimeError, r"^cutlass_scaled_mm: scales of shapes \[4, 1\] and \[31\] match no"):
        mm(a, b, sa, sb[:31], torch.bfloat16)
    blocks = (torch.ones(M, 2, device=device), torch.ones(2, 1, device=device))  # K = 256
    a2 = torch.ones(M, 256, dtype=torch.int8, device=device)
    b2 = torch.ones(N, 256, dtype=torch.int8, device=device).t()
    with raises(RuntimeError, r"^cutlass_scaled_mm: blockwise scales need float8_e4m3fn operands"):
        mm(a2, b2, blocks[0], blocks[1], torch.bfloat16)
    with raises(RuntimeError, r"^cutlass_scaled_mm: bias must be bfloat16, got float32"):
        mm(a, b, sa, sb, torch.bfloat16, torch.ones(N, device=device))
    with raises(RuntimeError, r"^cutlass_scaled_mm: bias must have shape \[32\] \(\[N\], one per"):
        mm(a, b, sa, sb, torch.bfloat16, torch.ones(16, device=device).bfloat16())


@pytest.mark.kernels_ci
def test_activation_names(kernel, device, args):
    a, b, sa, sb = args
    with raises(ValueError, r'^cutlass_scaled_mm: activation must be None, "none", "gelu"'):
        kernel.cutlass_scaled_mm(a, b, sa, sb, torch.bfloat16, activation="relu")
    with raises(RuntimeError, r'^cutlass_scaled_mm_act: activation must be one of "none", "ge'):
        kernel.ops.cutlass_scaled_mm_act(out(device), a, b, sa, sb, None, "relu")


@pytest.mark.kernels_ci
def test_zero_points(kernel, device, args):
    a, b, sa, sb = args
    adj = torch.zeros(N, dtype=torch.int32, device=device)
    azp = torch.zeros(M, dtype=torch.int32, device=device)
    mm = kernel.cutlass_scaled_mm_azp
    with raises(RuntimeError, r"^cutlass_scaled_mm_azp: azp_adj must be int32, got int64"):
        mm(a, b, sa, sb, torch.bfloat16, adj.long(), azp)
    with raises(RuntimeError, r"^cutlass_scaled_mm_azp: azp_adj must have shape \[32\]"):
        mm(a, b, sa, sb, torch.bfloat16, adj[:16], azp)
    with raises(RuntimeError, r"^cutlass_scaled_mm_azp: azp must have M = 4 elements"):
        mm(a, b, sa, sb, torch.bfloat16, adj, azp[:3])
    with raises(RuntimeError, r"^cutlass_scaled_mm_azp: azp must be int32, got float32"):
        mm(a, b, sa, sb, torch.bfloat16, adj, azp.float())
    if device == "cpu" or torch.cuda.get_device_capability() >= (8, 9):
        f8 = a.float().to(FP8), b.float().to(FP8)
        with raises(RuntimeError, r"^cutlass_scaled_mm_azp: zero points need int8 operands"):
            mm(f8[0], f8[1], sa, sb, torch.bfloat16, adj, azp)


@pytest.mark.kernels_ci
def test_matmul_2d_rejects_what_it_does_not_support(kernel, device):
    A = torch.randn(3, K, device=device).bfloat16()
    B = torch.ones(N, K, device=device).to(FP8)
    Bs = torch.ones(1, 1, device=device)
    with raises(NotImplementedError, r"^matmul_2d: B of dtype int8 and shape \[32, 64\] is not"):
        kernel.matmul_2d(A, B.view(torch.int8), Bs, [128, 128])
    B2 = torch.ones(N, 256, device=device).to(FP8)
    with raises(NotImplementedError, r"^matmul_2d: block_size \[64, 64\] with Bs of shape"):
        A2 = torch.randn(3, 256, device=device).bfloat16()
        kernel.matmul_2d(A2, B2, torch.ones(1, 4, device=device), [64, 64])
    with raises(ValueError, r"^matmul_2d: output_dtype must be torch.float16 or torch.bfloat16"):
        kernel.matmul_2d(A.float(), B, Bs, [128, 128])
    with raises(ValueError, r"^matmul_2d: A must have K = 64 \(B is \[N, K\]\)"):
        kernel.matmul_2d(A[:, :48], B, Bs, [128, 128])
    with raises(ValueError, r"^matmul_2d: activation_scale must have one element"):
        kernel.matmul_2d(A, B, Bs, [128, 128], activation_scale=torch.ones(2, device=device))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device (a GPU)")
def test_device_mismatch(kernel, args):
    a, b, sa, sb = (t.cuda() for t in args)
    with raises(RuntimeError, r"^cutlass_scaled_mm: a must be on the device of out"):
        kernel.ops.cutlass_scaled_mm(out("cuda"), a.cpu(), b, sa, sb, None)
    with raises(RuntimeError, r"^cutlass_scaled_mm: a_scales must be on the device of out"):
        kernel.cutlass_scaled_mm(a, b, sa.cpu(), sb, torch.bfloat16)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() >= (8, 9),
    reason="needs a GPU without fp8 (compute capability < 8.9)",
)
def test_fp8_needs_compute_capability_8_9(kernel):
    a = torch.ones(M, K, device="cuda").to(FP8)
    b = torch.ones(N, K, device="cuda").to(FP8).t()
    one = torch.ones(1, device="cuda")
    with raises(RuntimeError, r"^cutlass_scaled_mm: float8_e4m3fn needs a GPU of compute capab"):
        kernel.cutlass_scaled_mm(a, b, one, one, torch.bfloat16)


@pytest.mark.skipif(
    not torch.cuda.is_available()
    or torch.cuda.get_device_capability() < (8, 9)
    or torch.cuda.get_device_capability() == (9, 0),
    reason="needs an fp8 GPU without the blockwise kernels (not 9.0)",
)
def test_blockwise_needs_hopper(kernel):
    # K = 128, N = 256: scales [M, 1] and [1, 2] read only as blockwise
    a = torch.ones(M, 128, device="cuda").to(FP8)
    b = torch.ones(256, 128, device="cuda").to(FP8).t()
    sa, sb = torch.ones(M, 1, device="cuda"), torch.ones(1, 2, device="cuda")
    with raises(RuntimeError, r"^cutlass_scaled_mm: blockwise fp8 scales need a GPU of compute"):
        kernel.cutlass_scaled_mm(a, b, sa, sb, torch.bfloat16)


@pytest.mark.kernels_ci
def test_raw_ops_keep_their_names(kernel, device, args):
    """The wrappers name themselves (cutlass_scaled_mm for its _act op); raw ops keep theirs."""
    a, b, sa, sb = args
    with raises(RuntimeError, r"^cutlass_scaled_mm: a_scales must be float32"):
        kernel.cutlass_scaled_mm(a, b, sa.half(), sb, torch.bfloat16, activation="gelu")
    with raises(RuntimeError, r"^cutlass_scaled_mm_act: a_scales must be float32"):
        kernel.ops.cutlass_scaled_mm_act(out(device), a, b, sa.half(), sb, None, "gelu")
