"""Values of the scaled GEMMs (cutlass_scaled_mm, its azp and activation forms, blockwise fp8,
matmul_2d) against the float64 dequantized product, within the bound quant_scaled_mm_reference.py
derives: fp8 and int8, every scale mode, zero points, bias, the four activations, float16 and
bfloat16 outputs, odd multiples of 16, strided rows of a, b as the .t() of a row-major weight,
outputs poisoned with NaN. On CUDA every test also runs on the mma.sync path ("sm80")."""

import pytest
import quant_scaled_mm_reference as ref
import torch
from quant_op_conformance import assert_only_declared_arguments_change, opcheck_all

FP8 = torch.float8_e4m3fn
OUT_DTYPES = [torch.bfloat16, torch.float16]
ACTIVATIONS = [None, "gelu", "gelu_tanh", "silu"]
# Token counts: empty, decode, odd, tile-sized, one more than a 256-row tile; prefill on CUDA.
MS = [0, 1, 7, 16, 64, 300] + ([4096] if torch.cuda.is_available() else [])
# (N, K, out dtype): odd multiples of 16, each shape with one output dtype.
NK_OUTS = [(48, 208, torch.bfloat16), (400, 48, torch.float16)]


def fp8_ok(device: str) -> bool:
    return device == "cpu" or torch.cuda.get_device_capability() >= (8, 9)


# CUDA GEMM families (_set_scaled_mm_path); the CPU has one implementation.
PATHS = ["auto", "sm80"] if torch.cuda.is_available() else ["auto"]


@pytest.fixture(params=PATHS)
def path(request, kernel):
    """The CUDA GEMM family under test."""
    kernel.ops._set_scaled_mm_path(request.param)
    yield request.param
    kernel.ops._set_scaled_mm_path("auto")


def operand_device(device: str, operand: str) -> str:
    if operand == "fp8" and not fp8_ok(device):
        pytest.skip("float8_e4m3fn needs compute capability 8.9")
    return device


def block_device(kernel, device: str) -> str:
    if device != "cpu":
        major, minor = torch.cuda.get_device_capability()
        if not kernel.cutlass_scaled_mm_supports_block_fp8(major * 10 + minor):
            pytest.skip("blockwise fp8 needs compute capability 9.0")
    return device


def operands(operand, m, n, k, device, seed=0, a_pad=0):
    """a [M, K] (rows a_pad elements apart beyond K) and b [K, N], the .t() of a row-major
    weight. fp8 values are normals times 2 rounded to e4m3; int8 values uniform in [-128, 127]."""
    g = torch.Generator().manual_seed(seed)
    if operand == "fp8":
        a = (torch.randn(m, k, generator=g) * 2).to(FP8)
        w = (torch.randn(n, k, generator=g) * 2).to(FP8)
    else:
        a = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
        w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    if a_pad:
        wide = torch.zeros(m, k + a_pad, dtype=a.dtype)
        wide[:, :k] = a
        a = wide.to(device)[:, :k]
    else:
        a = a.to(device)
    return a, w.to(device).t()


def scales(operand, m, n, a_mode, b_mode, device, seed=1):
    """float32 scales that keep the outputs near 1: fp8 dots grow as 4 sqrt(K), int8 ones as
    5000 sqrt(K)."""
    g = torch.Generator().manual_seed(seed)
    base = 0.05 if operand == "fp8" else 2e-3
    sa = base * (0.5 + torch.rand((m, 1) if a_mode == "token" else (1,), generator=g))
    sb = base * (0.5 + torch.rand((n,) if b_mode == "channel" else (1,), generator=g))
    return sa.to(device), sb.to(device)


def coarse_accumulator(device: str, path: str) -> bool:
    """Whether fp8 GEMMs may run on Hopper's tensor cores (14-bit accumulation): the auto path
    on compute capability 9.0 and newer; mma.sync (sm80 path, sm_89) accumulates in float32."""
    return device != "cpu" and path == "auto" and torch.cuda.get_device_capability() >= (9, 0)


def check(got, a, b, sa, sb, out_dtype, device, path="auto", **kw):
    expected, magnitude, pre = ref.reference(a, b, sa, sb, **kw)
    tol = ref.bound(
        expected,
        magnitude,
        pre,
        k=a.shape[1],
        out_dtype=out_dtype,
        fp8=a.dtype == FP8,
        blockwise=kw.get("blockwise", False),
        coarse_accumulator=coarse_accumulator(device, path),
    )
    assert got.dtype == out_dtype and got.shape == expected.shape
    ref.assert_close(got, expected, tol)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("operand", ["fp8", "int8"])
@pytest.mark.parametrize("a_mode", ["tensor", "token"])
@pytest.mark.parametrize("b_mode", ["tensor", "channel"])
@pytest.mark.parametrize("m", MS, ids=str)
@pytest.mark.parametrize("nk_out", NK_OUTS, ids=str)
def test_scale_modes(kernel, device, path, operand, a_mode, b_mode, m, nk_out):
    dev = operand_device(device, operand)
    n, k, out_dtype = nk_out
    a, b = operands(operand, m, n, k, dev, seed=m)
    sa, sb = scales(operand, m, n, a_mode, b_mode, dev)
    got = kernel.cutlass_scaled_mm(a, b, sa, sb, out_dtype)
    check(got, a, b, sa, sb, out_dtype, dev, path)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("operand", ["fp8", "int8"])
@pytest.mark.parametrize(
    "m, n",
    # Each side of the M buckets of the Hopper dispatcher (scaled_mm_sm90.cu); at 64 < M <= 128
    # fp8 picks half-width tiles when the 64 x 128 ones would cover at most half the SMs
    # (97 x 1040: 18 tiles) and 64 x 128 ones otherwise (128 x 9232: 146 tiles); above 128 on
    # 132 SMs, 256 x 4096 takes 64 x 128 tiles and 512 x 6144 128 x 192 ones.
    [
        (16, 144),
        (17, 144),
        (65, 1040),
        (97, 1040),
        (128, 9232),
        (129, 400),
        (256, 4096),
        (512, 6144),
    ],
    ids=str,
)
def test_tile_buckets(kernel, device, path, operand, m, n):
    dev = operand_device(device, operand)
    k = 208
    a, b = operands(operand, m, n, k, dev, seed=m + n)
    sa, sb = scales(operand, m, n, "token", "channel", dev)
    got = kernel.cutlass_scaled_mm(a, b, sa, sb, torch.bfloat16, activation="silu")
    check(got, a, b, sa, sb, torch.bfloat16, dev, path, activation="silu")


@pytest.mark.kernels_ci
@pytest.mark.parametrize("operand", ["fp8", "int8"])
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
def test_bias_and_activation(kernel, device, path, operand, activation, with_bias, out_dtype):
    dev = operand_device(device, operand)
    m, n, k = 37, 208, 400
    a, b = operands(operand, m, n, k, dev, seed=2)
    sa, sb = scales(operand, m, n, "token", "channel", dev)
    # the bias moves the pre-activation values across the activations' bend near 0
    bias = (torch.randn(n) * 2).to(out_dtype).to(dev) if with_bias else None
    got = kernel.cutlass_scaled_mm(a, b, sa, sb, out_dtype, bias, activation=activation)
    check(got, a, b, sa, sb, out_dtype, dev, path, bias=bias, activation=activation)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("operand", ["fp8", "int8"])
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
def test_raw_ops_write_only_out(kernel, device, path, operand, out_dtype):
    """Strided rows of a, out a column slice of a NaN-filled buffer: every element of out is
    written, nothing beyond it."""
    dev = operand_device(device, operand)
    m, n, k = 19, 48, 208
    a, b = operands(operand, m, n, k, dev, seed=3, a_pad=48)
    assert a.stride(0) == k + 48
    sa, sb = scales(operand, m, n, "token", "channel", dev)
    bias = torch.randn(n).to(out_dtype).to(dev)
    for activation in (None, "silu"):
        buffer = torch.full((m, n + 24), float("nan"), dtype=out_dtype, device=dev)
        out = buffer[:, :n]
        if activation is None:
            kernel.ops.cutlass_scaled_mm(out, a, b, sa, sb, bias)
        else:
            kernel.ops.cutlass_scaled_mm_act(out, a, b, sa, sb, bias, activation)
        check(out, a, b, sa, sb, out_dtype, dev, path, bias=bias, activation=activation)
        assert buffer[:, n:].isnan().all()


@pytest.mark.kernels_ci
@pytest.mark.parametrize("per_token", [False, True], ids=["azp_per_tensor", "azp_per_token"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("m", [1, 7, 64], ids=str)
def test_azp(kernel, device, path, per_token, with_bias, m):
    """Asymmetric int8 activations, quantized by scaled_int8_quant: the reference is the float64
    product of the dequantized a, (q - azp) * scale, so azp_adj must carry the right terms."""
    n, k = 48, 208
    g = torch.Generator().manual_seed(4)
    x = (torch.rand(m, k, generator=g) * 3 - 0.5).to(device)  # mostly positive: a real zero point
    if per_token:
        q, sa, azp = kernel.scaled_int8_quant(x, symmetric=False)
    else:
        sa = torch.tensor([3.5 / 255], device=device)
        azp = torch.tensor([-128 + 36], dtype=torch.int32, device=device)
        q, _, _ = kernel.scaled_int8_quant(x, sa, azp, symmetric=False)
    _, b = operands("int8", 1, n, k, device, seed=5)
    sb = 2e-3 * (0.5 + torch.rand(n, generator=g)).to(device)
    col_sums = b.to(torch.int32).sum(dim=0, dtype=torch.int32)
    if per_token:
        azp_adj, azp_arg = col_sums, azp.reshape(m)
    else:
        azp_adj, azp_arg = col_sums * azp, None
    bias = torch.randn(n).to(torch.bfloat16).to(device) if with_bias else None
    got = kernel.cutlass_scaled_mm_azp(q, b, sa, sb, torch.bfloat16, azp_adj, azp_arg, bias)
    centered = q.to(torch.int32) - azp.reshape(-1, 1)
    expected, magnitude, pre = ref.reference(centered, b, sa, sb, bias=bias)
    tol = ref.bound(expected, magnitude, pre, k=k, out_dtype=torch.bfloat16, fp8=False)
    ref.assert_close(got, expected, tol)


def block_scales(m, n, k, device, seed=6, column_major_a=False):
    g = torch.Generator().manual_seed(seed)
    kb, nb = k // 128, (n + 127) // 128
    sa = 0.02 * (0.5 + torch.rand(m, kb, generator=g))
    if column_major_a:
        sa = sa.t().contiguous().t()
    weight_scale_inv = 0.05 * (0.5 + torch.rand(nb, kb, generator=g))  # checkpoint layout
    return sa.to(device), weight_scale_inv.to(device).t()


@pytest.mark.kernels_ci
@pytest.mark.parametrize("m", [1, 7, 64, 300], ids=str)
@pytest.mark.parametrize("nk", [(48, 384), (400, 128), (256, 256)], ids=str)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("column_major_a", [False, True], ids=["a_row_major", "a_col_major"])
def test_blockwise(kernel, device, m, nk, out_dtype, column_major_a):
    """N = 400: a partial last N block; K = 128: one K block."""
    dev = block_device(kernel, operand_device(device, "fp8"))
    n, k = nk
    a, b = operands("fp8", m, n, k, dev, seed=7)
    sa, sb = block_scales(m, n, k, dev, column_major_a=column_major_a)
    got = kernel.cutlass_scaled_mm(a, b, sa, sb, out_dtype)
    check(got, a, b, sa, sb, out_dtype, dev, blockwise=True)


@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
def test_blockwise_bias_activation_and_poison(kernel, device, activation):
    dev = block_device(kernel, operand_device(device, "fp8"))
    m, n, k = 33, 400, 256
    a, b = operands("fp8", m, n, k, dev, seed=8, a_pad=16)
    sa, sb = block_scales(m, n, k, dev, seed=9)
    bias = (torch.randn(n) * 2).to(torch.bfloat16).to(dev)
    buffer = torch.full((m, n + 8), float("nan"), dtype=torch.bfloat16, device=dev)
    out = buffer[:, :n]
    kernel.ops.cutlass_scaled_mm_act(out, a, b, sa, sb, bias, activation or "none")
    check(out, a, b, sa, sb, torch.bfloat16, dev, bias=bias, activation=activation, blockwise=True)
    assert buffer[:, n:].isnan().all()


def test_blockwise_empty_m(kernel, device):
    dev = block_device(kernel, operand_device(device, "fp8"))
    a, b = operands("fp8", 0, 256, 256, dev)
    sa, sb = block_scales(0, 256, 256, dev)
    assert kernel.cutlass_scaled_mm(a, b, sa, sb, torch.bfloat16).shape == (0, 256)


@pytest.mark.kernels_ci
@pytest.mark.parametrize(
    "mode", ["block_dynamic", "block_static", "tensor_dynamic", "tensor_static"]
)
def test_matmul_2d(kernel, device, mode):
    """finegrained-fp8's matmul_2d: A [..., K] quantized by the package's own (separately tested)
    quantize ops, then the GEMM; the reference multiplies those quantized values in float64."""
    dev = operand_device(device, "fp8")
    if mode.startswith("block"):
        block_device(kernel, dev)
    n, k = 400, 256
    g = torch.Generator().manual_seed(10)
    A = torch.randn(2, 5, k, generator=g).to(torch.bfloat16).to(dev)
    B = (torch.randn(n, k, generator=g) * 2).to(FP8).to(dev)
    static = torch.tensor([0.02], device=dev)
    x = A.reshape(-1, k)
    if mode.startswith("block"):
        _, Bs = block_scales(1, n, k, dev)
        Bs = Bs.t()  # [ceil(N / 128), K / 128], as checkpoints store it
        if mode == "block_dynamic":
            q, sa = kernel.per_token_group_quant_fp8(x, 128)
        else:
            q, _ = kernel.scaled_fp8_quant(x, static)
            sa = static.reshape(1, 1).expand(x.shape[0], k // 128)
        kw = dict(blockwise=True)
        sb = Bs.t()
    else:
        Bs = torch.tensor([0.05], device=dev)
        if mode == "tensor_dynamic":
            q, sa = kernel.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
        else:
            q, sa = kernel.scaled_fp8_quant(x, static)
        kw = {}
        sb = Bs
    got = kernel.matmul_2d(
        A, B, Bs, [128, 128], activation_scale=static if mode.endswith("static") else None
    )
    assert got.shape == (2, 5, n) and got.dtype == torch.bfloat16
    check(got.reshape(-1, n), q, B.t(), sa, sb, torch.bfloat16, dev, **kw)
    half = kernel.matmul_2d(A, B, Bs, (128, 128), output_dtype=torch.float16)
    assert half.dtype == torch.float16 and half.shape == (2, 5, n)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_capture(kernel, device, path):
    """The GEMMs capture (no host sync, workspace from the caching allocator) and replay with new
    operand values, matching eager."""
    cases = [("int8", False)]
    if fp8_ok(device):
        cases.append(("fp8", False))
        major, minor = torch.cuda.get_device_capability()
        if path == "auto" and kernel.cutlass_scaled_mm_supports_block_fp8(major * 10 + minor):
            cases.append(("fp8", True))
    m, n, k = 64, 400, 256
    inputs = []
    for operand, blockwise in cases:
        a, b = operands(operand, m, n, k, device)
        if blockwise:
            sa, sb = block_scales(m, n, k, device)
        else:
            sa, sb = scales(operand, m, n, "token", "channel", device)
        inputs.append((a, b, sa, sb))

    def run_all():
        return [kernel.cutlass_scaled_mm(*x, torch.bfloat16, activation="gelu") for x in inputs]

    run_all()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run_all()
    for (operand, _), (a, _, _, _) in zip(cases, inputs):
        a.copy_(operands(operand, m, n, k, device, seed=99)[0])
    graph.replay()
    torch.cuda.synchronize()
    for got, expected in zip(captured, run_all()):
        assert torch.equal(got, expected)


def test_supports_probes(kernel):
    """The CPU build answers what a CUDA build supports (kernel_src/scaled_mm_support.h)."""
    fp8 = {cap: kernel.cutlass_scaled_mm_supports_fp8(cap) for cap in (75, 80, 86, 89, 90, 100)}
    block = {cap: kernel.cutlass_scaled_mm_supports_block_fp8(cap) for cap in (80, 89, 90, 100)}
    if not torch.cuda.is_available():
        assert fp8 == {75: False, 80: False, 86: False, 89: True, 90: True, 100: True}
        assert block == {80: False, 89: False, 90: True, 100: False}
    assert not fp8[80] and fp8[89] and fp8[90] and block[90] and not block[89]
    assert kernel.ops.cutlass_scaled_mm_supports_fp8(89) is True


def test_path_setting(kernel):
    kernel.ops._set_scaled_mm_path("sm80")
    kernel.ops._set_scaled_mm_path("auto")
    with pytest.raises(RuntimeError, match=r'^_set_scaled_mm_path: path must be "auto" or "sm80"'):
        kernel.ops._set_scaled_mm_path("sm90")


def test_cpu_int8_speed(kernel, device):
    """The CPU backend is usable: one 1024^3 int8 GEMM in well under a second (about 0.2 s on
    two cores; the limit leaves room for a loaded machine)."""
    import time

    if device != "cpu":
        pytest.skip("CPU backend timing")
    a, b = operands("int8", 1024, 1024, 1024, device)
    sa, sb = scales("int8", 1024, 1024, "token", "channel", device)
    kernel.cutlass_scaled_mm(a[:16], b, sa[:16], sb, torch.bfloat16)  # warm up the pool
    start = time.perf_counter()
    kernel.cutlass_scaled_mm(a, b, sa, sb, torch.bfloat16)
    assert time.perf_counter() - start < 2.0


# ---- torch.library conformance ----


def _raw_cases(kernel, device):
    cases = []
    for operand in ("int8", "fp8"):
        if operand == "fp8" and not fp8_ok(device):
            continue
        a, b = operands(operand, 7, 48, 128, device)
        sa, sb = scales(operand, 7, 48, "token", "channel", device)
        out = lambda: torch.empty(7, 48, dtype=torch.bfloat16, device=device)  # noqa: E731
        bias = torch.randn(48, device=device).to(torch.bfloat16)
        cases += [
            ("cutlass_scaled_mm", (out(), a, b, sa[:1], sb[:1], None)),
            ("cutlass_scaled_mm_act", (out(), a, b, sa, sb, bias, "gelu_tanh")),
        ]
        if operand == "int8":
            adj = b.to(torch.int32).sum(0, dtype=torch.int32)
            azp = torch.arange(7, dtype=torch.int32, device=device)
            cases.append(("cutlass_scaled_mm_azp", (out(), a, b, sa, sb, adj, azp, bias)))
        elif device == "cpu" or kernel.cutlass_scaled_mm_supports_block_fp8(
            torch.cuda.get_device_capability()[0] * 10 + torch.cuda.get_device_capability()[1]
        ):
            a, b = operands(operand, 7, 48, 256, device)
            bsa, bsb = block_scales(7, 48, 256, device)
            cases.append(("cutlass_scaled_mm", (out(), a, b, bsa, bsb, None)))
    return cases


@pytest.mark.kernels_ci
def test_opcheck(kernel, device):
    opcheck_all(kernel, _raw_cases(kernel, device))


@pytest.mark.kernels_ci
def test_only_declared_arguments_change(kernel, device):
    assert_only_declared_arguments_change(kernel, _raw_cases(kernel, device))


@pytest.mark.kernels_ci
def test_compile_fullgraph(kernel, device):
    """Every wrapper traces without a graph break and matches eager bit for bit."""
    dev = operand_device(device, "fp8")
    torch._dynamo.reset()
    a8, b8 = operands("int8", 9, 48, 256, dev)
    af, bf = operands("fp8", 9, 48, 256, dev)
    sa, sb = scales("int8", 9, 48, "token", "channel", dev)
    adj = b8.to(torch.int32).sum(0, dtype=torch.int32)
    azp = torch.arange(9, dtype=torch.int32, device=dev)
    A = torch.randn(3, 3, 256, device=dev).to(torch.bfloat16)
    W = bf.t()
    Ws = torch.tensor([0.05], device=dev)

    def fn(a8, b8, af, bf, sa, sb, adj, azp, A, W, Ws):
        return (
            kernel.cutlass_scaled_mm(a8, b8, sa, sb, torch.bfloat16),
            kernel.cutlass_scaled_mm(af, bf, sa, sb, torch.float16, activation="silu"),
            kernel.cutlass_scaled_mm_azp(a8, b8, sa, sb, torch.bfloat16, adj, azp),
            kernel.matmul_2d(A, W, Ws, [128, 128]),
        )

    args = (a8, b8, af, bf, sa, sb, adj, azp, A, W, Ws)
    eager = fn(*args)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(*args)
    for g, e in zip(compiled, eager):
        assert torch.equal(g, e)


def test_compile_inductor_no_recompile(kernel, device):
    """Inductor with dynamic token counts: one graph for every M."""
    torch._dynamo.reset()
    _, b = operands("int8", 1, 48, 128, device)
    sb = torch.full((48,), 1e-3, device=device)

    def fn(x):
        q, s, _ = kernel.scaled_int8_quant(x)
        return kernel.cutlass_scaled_mm(q, b, s, sb, torch.bfloat16, activation="gelu")

    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for m in (3, 17, 64):
            x = torch.randn(m, 128, device=device)
            assert torch.equal(compiled(x), fn(x))
