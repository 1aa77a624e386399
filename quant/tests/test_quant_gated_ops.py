"""The fused-epilogue surface: linear_act (16-bit x @ weight.T with bias and activation) and the
gated MLP form (cutlass_scaled_mm_gated, linear_gated, pack_gate_up / unpack_gate_up).

Values are checked against float64 references within bounds derived from quant_scaled_mm_reference.py
(see gated_bound), on every operand (fp8, int8, bfloat16, float16), activation, bias and output
dtype, on the fused ops and on the unfused fallback the wrappers take where the fused op does not
run: "unfused" forces it on any device, "sm80" (CUDA) takes it through the path setting.
"""

import pytest
import quant_scaled_mm_reference as ref
import torch
from quant_op_conformance import assert_only_declared_arguments_change, opcheck_all

FP8 = torch.float8_e4m3fn
OPERANDS = ["fp8", "int8", "bf16", "fp16"]
SIXTEEN_BIT = {"bf16": torch.bfloat16, "fp16": torch.float16}
ACTIVATIONS = [None, "gelu", "gelu_tanh", "silu"]
MS = [0, 1, 7, 16, 64, 300] + ([4096] if torch.cuda.is_available() else [])
# (N, K, out dtype of the quantized operands): N multiples of 64, K odd multiples of 16.
NK_OUTS = [(64, 208, torch.bfloat16), (192, 48, torch.float16), (320, 80, torch.bfloat16)]
# Largest slope of the activations (gelu's, about 1.13; silu's is 1.1; "none" 1).
ACT_SLOPE = 1.13

PATHS = ["auto", "unfused"] + (["sm80"] if torch.cuda.is_available() else [])


@pytest.fixture(params=PATHS)
def path(request, kernel, monkeypatch):
    """auto: the wrappers' own choice; unfused: the fallback forced; sm80 (CUDA): the mma.sync
    path, on which the wrappers must choose the fallback."""
    if request.param == "unfused":
        monkeypatch.setattr(kernel, "_fused_epilogue_runs_on", lambda device: False)
    if request.param == "sm80":
        kernel._set_scaled_mm_path("sm80")
    # cuBLAS may round split-K partial sums of 16-bit GEMMs to 16 bits (the fallback's F.linear);
    # the bounds assume float32 accumulation, as the fused kernels do.
    bf16_reduced = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    fp16_reduced = torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    yield request.param
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = bf16_reduced
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = fp16_reduced
    kernel._set_scaled_mm_path("auto")


def hopper(device: str) -> bool:
    return device != "cpu" and torch.cuda.get_device_capability() == (9, 0)


def operand_device(device: str, operand: str) -> str:
    if operand == "fp8" and device != "cpu" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8_e4m3fn needs compute capability 8.9")
    return device


def weights(operand, rows, k, seed):
    """A row-major [rows, K] weight: fp8 normals times 2 rounded to e4m3, int8 uniform, 16-bit
    normals over sqrt(K) (outputs near 1)."""
    g = torch.Generator().manual_seed(seed)
    if operand == "fp8":
        return (torch.randn(rows, k, generator=g) * 2).to(FP8)
    if operand == "int8":
        return torch.randint(-128, 128, (rows, k), generator=g, dtype=torch.int8)
    return (torch.randn(rows, k, generator=g) / k**0.25).to(SIXTEEN_BIT[operand])


def gated_operands(operand, m, n, k, device, seed=0):
    """a [M, K], gate and up weights [N, K], their packed transpose b [K, 2N], and the scales
    (a per token, gate / up per channel; None for 16-bit)."""
    a = weights(operand, m, k, seed)
    gate, up = weights(operand, n, k, seed + 1), weights(operand, n, k, seed + 2)
    if operand in SIXTEEN_BIT:
        return a.to(device), gate, up, None, None, None
    g = torch.Generator().manual_seed(seed + 3)
    base = 0.05 if operand == "fp8" else 2e-3
    sa = base * (0.5 + torch.rand(m, 1, generator=g))
    sg = base * (0.5 + torch.rand(n, generator=g))
    su = base * (0.5 + torch.rand(n, generator=g))
    return a.to(device), gate, up, sa.to(device), sg, su


def coarse_accumulator(device, path, operand) -> bool:
    """fp8 on Hopper's tensor cores (14-bit accumulation), fused or through cutlass_scaled_mm."""
    return operand == "fp8" and hopper(device) and path != "sm80"


def gated_bound(a, gate, up, sa, sg, su, bg, bu, activation, out_dtype, coarse):
    """(reference, bound) of act(g) * u, float64. Each of g and u gets ref.bound's error
    (accumulation, float32 epilogue, one rounding to out_dtype: the unfused path rounds the
    [M, 2N] product before the gate), e_g and e_u; then |act(g) * u - act(g') * u'| <=
    slope * e_g * (|u| + e_u) + |act(g)| * e_u, plus the product's float32 roundings and the
    final rounding to out_dtype."""
    one = torch.ones(1)
    parts = []
    for w, s, bias in ((gate, sg, bg), (up, su, bu)):
        pre, magnitude, _ = ref.reference(
            a, w.t(), one if sa is None else sa, one if s is None else s, bias=bias
        )
        fp = a.dtype != torch.int8
        err = ref.bound(
            pre,
            magnitude,
            pre,
            k=a.shape[1],
            out_dtype=out_dtype,
            fp8=fp,
            coarse_accumulator=coarse,
        )
        parts.append((pre, err))
    (g, e_g), (u, e_u) = parts
    act_g = ref.activate(g, activation)
    expected = act_g * u
    err = ACT_SLOPE * e_g * (u.abs() + e_u) + act_g.abs() * e_u + 8 * ref.U32 * expected.abs()
    u_out = ref.U_OUT[out_dtype]
    return expected, u_out * expected.abs() + (1 + u_out) * err + 2.0**-24


def run_gated(kernel, operand, a, gate, up, sa, sg, su, bias_pair, activation, out_dtype, device):
    packed = kernel.pack_gate_up(gate, up).to(device)
    bias = None
    if bias_pair is not None:
        bias = kernel.pack_gate_up(*bias_pair).to(device)
    if operand in SIXTEEN_BIT:
        return kernel.linear_gated(a, packed, bias, activation)
    sb = kernel.pack_gate_up(sg, su).to(device)
    return kernel.cutlass_scaled_mm_gated(a, packed.t(), sa, sb, out_dtype, activation, bias)


def check_gated(got, a, gate, up, sa, sg, su, bias_pair, activation, out_dtype, coarse):
    bg, bu = bias_pair if bias_pair is not None else (None, None)
    expected, tol = gated_bound(
        a.cpu(), gate, up, sa, sg, su, bg, bu, activation, out_dtype, coarse
    )
    assert got.dtype == out_dtype and got.shape == expected.shape
    ref.assert_close(got, expected, tol)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("operand", OPERANDS)
@pytest.mark.parametrize("m", MS, ids=str)
@pytest.mark.parametrize("nk_out", NK_OUTS, ids=str)
def test_gated_shapes(kernel, device, path, operand, m, nk_out):
    dev = operand_device(device, operand)
    n, k, out_dtype = nk_out
    out_dtype = SIXTEEN_BIT.get(operand, out_dtype)
    a, gate, up, sa, sg, su = gated_operands(operand, m, n, k, dev, seed=m)
    got = run_gated(kernel, operand, a, gate, up, sa, sg, su, None, "silu", out_dtype, dev)
    check_gated(
        got,
        a,
        gate,
        up,
        sa,
        sg,
        su,
        None,
        "silu",
        out_dtype,
        coarse_accumulator(dev, path, operand),
    )


@pytest.mark.kernels_ci
@pytest.mark.parametrize("operand", OPERANDS)
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gated_bias_and_activation(kernel, device, path, operand, activation, with_bias, out_dtype):
    if operand in SIXTEEN_BIT and SIXTEEN_BIT[operand] != out_dtype:
        pytest.skip("16-bit operands write their own dtype")
    dev = operand_device(device, operand)
    m, n, k = 37, 192, 400
    a, gate, up, sa, sg, su = gated_operands(operand, m, n, k, dev, seed=2)
    bias_pair = None
    if with_bias:
        # moves the gate's pre-activation values across the activations' bend near 0
        g = torch.Generator().manual_seed(9)
        bias_pair = tuple((torch.randn(n, generator=g) * 2).to(out_dtype) for _ in range(2))
    got = run_gated(kernel, operand, a, gate, up, sa, sg, su, bias_pair, activation, out_dtype, dev)
    coarse = coarse_accumulator(dev, path, operand)
    check_gated(got, a, gate, up, sa, sg, su, bias_pair, activation, out_dtype, coarse)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("operand", ["fp8", "int8"])
def test_gated_per_tensor_scales(kernel, device, path, operand):
    dev = operand_device(device, operand)
    m, n, k = 9, 128, 208
    a, gate, up, sa, sg, su = gated_operands(operand, m, n, k, dev, seed=4)
    sa, sg, su = sa[:1, 0], sg[:1], sg[:1]
    packed = kernel.pack_gate_up(gate, up).to(dev)
    got = kernel.cutlass_scaled_mm_gated(a, packed.t(), sa, sg.to(dev), torch.bfloat16)
    coarse = coarse_accumulator(dev, path, operand)
    check_gated(got, a, gate, up, sa, sg, su, None, "silu", torch.bfloat16, coarse)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("m", MS, ids=str)
def test_linear_act(kernel, device, path, dtype, activation, with_bias, m):
    n, k = (48, 208) if m % 2 else (400, 80)
    operand = "bf16" if dtype == torch.bfloat16 else "fp16"
    x = weights(operand, m, k, seed=m).reshape(1, m, k).to(device)  # leading dimensions
    w = weights(operand, n, k, seed=m + 1)
    bias = (torch.randn(n) * 2).to(dtype) if with_bias else None
    got = kernel.linear_act(x, w.to(device), None if bias is None else bias.to(device), activation)
    pre, magnitude, _ = ref.reference(x[0].cpu(), w.t(), torch.ones(1), torch.ones(1), bias=bias)
    expected = ref.activate(pre, activation)
    # the unfused path rounds x @ w.T + bias to dtype before the activation: one more rounding of
    # pre, through a slope of at most ACT_SLOPE
    tol = ref.bound(expected, magnitude, pre, k=k, out_dtype=dtype, fp8=True)
    tol = tol + ACT_SLOPE * ref.U_OUT[dtype] * pre.abs()
    assert got.dtype == dtype and got.shape == (1, m, n)
    ref.assert_close(got[0], expected, tol)


def test_linear_act_unaligned_shapes_fall_back(kernel, device):
    """N or K off the multiples of 16 take the unfused path instead of failing."""
    x = torch.randn(5, 30, device=device).to(torch.bfloat16)
    w = torch.randn(20, 30, device=device).to(torch.bfloat16)
    got = kernel.linear_act(x, w, activation="gelu")
    expected = torch.nn.functional.gelu(x.double() @ w.double().t())
    assert (got.double() - expected).abs().max() < 0.05 * expected.abs().max()


def test_fallback_rule(kernel, device):
    """Fused on the CPU and on capability 9.0 with the auto path; unfused otherwise."""
    dev = torch.device(device)
    assert kernel._fused_epilogue_runs_on(dev) == (device == "cpu" or hopper(device))
    kernel._set_scaled_mm_path("sm80")
    try:
        assert kernel._fused_epilogue_runs_on(dev) == (device == "cpu")
    finally:
        kernel._set_scaled_mm_path("auto")


@pytest.mark.parametrize(
    "shape",
    [(128, 48), (64, 16), (192,), (64, 1), (256, 1)],
    ids=["w", "w64", "vec", "col", "col2"],
)
@pytest.mark.parametrize("dtype", [FP8, torch.int8, torch.bfloat16, torch.float32], ids=str)
def test_pack_unpack_round_trip(kernel, device, shape, dtype):
    g = torch.Generator().manual_seed(5)
    gate = torch.randn(shape, generator=g).mul(3).to(dtype).to(device)
    up = torch.randn(shape, generator=g).mul(3).to(dtype).to(device)
    packed = kernel.pack_gate_up(gate, up)
    n = shape[0]
    assert packed.shape == (2 * n, *shape[1:]) and packed.dtype == dtype
    view = packed.view(torch.uint8) if dtype == FP8 else packed
    # block j of 64 rows: gate rows 64j.., then up rows 64j..
    for j in range(n // 64):
        gv = gate.view(torch.uint8) if dtype == FP8 else gate
        uv = up.view(torch.uint8) if dtype == FP8 else up
        assert torch.equal(view[128 * j : 128 * j + 64], gv[64 * j : 64 * j + 64])
        assert torch.equal(view[128 * j + 64 : 128 * j + 128], uv[64 * j : 64 * j + 64])
    g2, u2 = kernel.unpack_gate_up(packed)
    assert torch.equal(g2.view(torch.uint8), gate.view(torch.uint8))
    assert torch.equal(u2.view(torch.uint8), up.view(torch.uint8))


# ---- raw ops: every element written, nothing beyond ----


def fused_device(device: str) -> str:
    if device != "cpu" and not hopper(device):
        pytest.skip("the fused ops run on compute capability 9.0 only")
    return device


@pytest.mark.kernels_ci
@pytest.mark.parametrize("operand", OPERANDS)
def test_raw_gated_op_writes_only_out(kernel, device, operand):
    dev = fused_device(operand_device(device, operand))
    m, n, k = 19, 128, 208
    a, gate, up, sa, sg, su = gated_operands(operand, m, n, k, dev, seed=6)
    out_dtype = SIXTEEN_BIT.get(operand, torch.float16)
    packed = kernel.pack_gate_up(gate, up).to(dev)
    sb = None if sg is None else kernel.pack_gate_up(sg, su).to(dev)
    g = torch.Generator().manual_seed(7)
    bias_pair = tuple(torch.randn(n, generator=g).to(out_dtype) for _ in range(2))
    bias = kernel.pack_gate_up(*bias_pair).to(dev)
    buffer = torch.full((m, n + 24), float("nan"), dtype=out_dtype, device=dev)
    out = buffer[:, :n]
    kernel.ops.scaled_mm_gated(out, a, packed.t(), sa, sb, bias, "gelu_tanh")
    check_gated(
        out,
        a,
        gate,
        up,
        sa,
        sg,
        su,
        bias_pair,
        "gelu_tanh",
        out_dtype,
        operand == "fp8" and dev != "cpu",
    )
    assert buffer[:, n:].isnan().all()


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_raw_linear_act_writes_only_out(kernel, device, dtype):
    if device == "cuda":  # the fused CUDA kernel is not built: the op says so
        x = torch.zeros(2, 16, dtype=dtype, device=device)
        w = torch.zeros(16, 16, dtype=dtype, device=device)
        with pytest.raises(RuntimeError, match=r"^linear_act: the fused CUDA kernel is not"):
            kernel.ops.linear_act(
                torch.empty(2, 16, dtype=dtype, device=device), x, w, None, "none"
            )
        return
    dev = fused_device(device)
    m, n, k = 19, 48, 208
    operand = "bf16" if dtype == torch.bfloat16 else "fp16"
    x, w = weights(operand, m, k, 8).to(dev), weights(operand, n, k, 9).to(dev)
    buffer = torch.full((m, n + 24), float("nan"), dtype=dtype, device=dev)
    out = buffer[:, :n]
    kernel.ops.linear_act(out, x, w, None, "silu")
    pre, magnitude, _ = ref.reference(x.cpu(), w.cpu().t(), torch.ones(1), torch.ones(1))
    expected = ref.activate(pre, "silu")
    ref.assert_close(
        out, expected, ref.bound(expected, magnitude, pre, k=k, out_dtype=dtype, fp8=True)
    )
    assert buffer[:, n:].isnan().all()


# ---- errors ----


def test_pack_errors(kernel):
    with pytest.raises(
        ValueError,
        match=r"^pack_gate_up: gate must be \[N\], \[N, 1\] or \[N, K\] with N a positive multiple of 64, got shape \[96, 16\]",
    ):
        kernel.pack_gate_up(torch.zeros(96, 16), torch.zeros(96, 16))
    with pytest.raises(ValueError, match=r"^pack_gate_up: up must have gate's shape"):
        kernel.pack_gate_up(torch.zeros(64, 16), torch.zeros(64, 32))
    with pytest.raises(ValueError, match=r"^unpack_gate_up: packed must have 2N rows"):
        kernel.unpack_gate_up(torch.zeros(64, 16))


def test_wrapper_errors(kernel, device):
    x = torch.zeros(4, 32, device=device, dtype=torch.bfloat16)
    with pytest.raises(
        ValueError, match=r"^linear_act: x must be bfloat16 or float16, got float32"
    ):
        kernel.linear_act(x.float(), x)
    with pytest.raises(ValueError, match=r"^linear_act: weight must be \[N, K\] of x's dtype"):
        kernel.linear_act(x, torch.zeros(16, 48, device=device, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r'^linear_act: activation must be None, "none"'):
        kernel.linear_act(x, x, activation="relu")
    with pytest.raises(ValueError, match=r"^linear_gated: packed_weight must be \[2N, K\]"):
        kernel.linear_gated(x, torch.zeros(128, 48, device=device, dtype=torch.bfloat16))
    with pytest.raises(
        ValueError,
        match=r"^linear_gated: b_packed must be \[K, 2N\] with N a positive multiple of 64",
    ):
        kernel.linear_gated(x, torch.zeros(64, 32, device=device, dtype=torch.bfloat16))


def gated_op_args(device, operand="int8", m=4, n=64, k=32):
    dtype = {"int8": torch.int8, "bf16": torch.bfloat16}[operand]
    a = torch.zeros(m, k, dtype=dtype, device=device)
    b = torch.zeros(2 * n, k, dtype=dtype, device=device).t()
    out = torch.empty(m, n, dtype=torch.bfloat16, device=device)
    return out, a, b


@pytest.mark.parametrize(
    "case, pattern",
    [
        (
            "no_scales",
            r"^scaled_mm_gated: float8_e4m3fn / int8 operands need a_scales and b_scales",
        ),
        ("16bit_scales", r"^scaled_mm_gated: bfloat16 / float16 operands take no scales"),
        ("b_scales", r"^scaled_mm_gated: b_scales must have 1 element \(per tensor\) or 2N = 128"),
        ("bias", r"^scaled_mm_gated: bias must have shape \[128\] \(\[2N\], packed like b\)"),
        (
            "n",
            r"^scaled_mm_gated: b must be a packed gate / up weight \[K, 2N\] with N a positive multiple of 64",
        ),
        ("activation", r'^scaled_mm_gated: activation must be one of "none"'),
        (
            "out_dtype",
            r"^scaled_mm_gated: out must have the dtype of a and b \(bfloat16\), got float16",
        ),
    ],
)
def test_gated_op_errors(kernel, device, case, pattern):
    out, a, b = gated_op_args(device, "bf16" if case in ("16bit_scales", "out_dtype") else "int8")
    sa = torch.ones(1, device=device)
    sb = torch.ones(128, device=device)
    bias, act = None, "silu"
    if case == "no_scales":
        sa = sb = None
    elif case == "b_scales":
        sb = torch.ones(64, device=device)
    elif case == "bias":
        bias = torch.zeros(64, dtype=torch.bfloat16, device=device)
    elif case == "n":
        out, a, b = gated_op_args(device, n=32)
    elif case == "activation":
        act = "relu"
    elif case == "out_dtype":
        sa = sb = None
        out = out.half()
    with pytest.raises(RuntimeError, match=pattern):
        kernel.ops.scaled_mm_gated(out, a, b, sa, sb, bias, act)


def test_linear_act_op_errors(kernel, device):
    x = torch.zeros(4, 32, dtype=torch.bfloat16, device=device)
    w = torch.zeros(16, 32, dtype=torch.bfloat16, device=device)
    out = torch.empty(4, 16, dtype=torch.bfloat16, device=device)
    with pytest.raises(
        RuntimeError,
        match=r"^linear_act: a and b must both be bfloat16 or both float16, got int8 and int8",
    ):
        kernel.ops.linear_act(out, x.to(torch.int8), w.to(torch.int8), None, "none")
    with pytest.raises(RuntimeError, match=r"^linear_act: weight must be row-major \[N, K\]"):
        kernel.ops.linear_act(
            out, x, torch.zeros(32, 16, dtype=torch.bfloat16, device=device).t(), None, "none"
        )
    with pytest.raises(
        RuntimeError,
        match=r"^linear_act: out must have the dtype of a and b \(bfloat16\), got float16",
    ):
        kernel.ops.linear_act(out.half(), x, w, None, "none")


def test_cuda_ops_refuse_off_hopper(kernel, device):
    """On CUDA the fused ops run only on capability 9.0 with the auto path: elsewhere a clear
    error (the wrappers take their fallback instead)."""
    if device == "cpu":
        pytest.skip("CUDA dispatch rule")
    out, a, b = gated_op_args(device, "bf16")
    if hopper(device):
        kernel._set_scaled_mm_path("sm80")
        pattern = r'^scaled_mm_gated: the gated form and bfloat16 / float16 operands run on the "auto" GEMM path only'
    else:
        pattern = r"^scaled_mm_gated: the gated form and bfloat16 / float16 operands need a GPU of compute capability 9.0"
    try:
        with pytest.raises(RuntimeError, match=pattern):
            kernel.ops.scaled_mm_gated(out, a, b, None, None, None, "silu")
    finally:
        kernel._set_scaled_mm_path("auto")


# ---- torch.library conformance, torch.compile ----


def _raw_cases(kernel, device):
    if device != "cpu" and not hopper(device):
        return []
    cases = []
    for operand in OPERANDS:
        a, gate, up, sa, sg, su = gated_operands(operand, 7, 64, 48, device)
        out_dtype = SIXTEEN_BIT.get(operand, torch.bfloat16)
        packed = kernel.pack_gate_up(gate, up).to(device)
        sb = None if sg is None else kernel.pack_gate_up(sg, su).to(device)
        bias = torch.randn(128).to(out_dtype).to(device)
        out = torch.empty(7, 64, dtype=out_dtype, device=device)
        cases.append(("scaled_mm_gated", (out, a, packed.t(), sa, sb, bias, "silu")))
        if operand in SIXTEEN_BIT and device == "cpu":  # no fused CUDA linear_act kernel
            out = torch.empty(7, 64, dtype=out_dtype, device=device)
            cases.append(("linear_act", (out, a, gate.to(device), bias[:64], "gelu")))
    return cases


@pytest.mark.kernels_ci
def test_library_conformance(kernel, device):
    """opcheck, and only the out argument (Tensor!) changes."""
    cases = _raw_cases(kernel, device)
    opcheck_all(kernel, cases)
    assert_only_declared_arguments_change(kernel, cases)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("unfused", [False, True], ids=["auto", "unfused"])
def test_compile_fullgraph(kernel, device, monkeypatch, unfused):
    """The wrappers trace without a graph break (the fused / unfused choice included) and match
    eager bit for bit."""
    if unfused:
        monkeypatch.setattr(kernel, "_fused_epilogue_runs_on", lambda device: False)
    torch._dynamo.reset()
    x = weights("bf16", 9, 48, 1).reshape(3, 3, 48).to(device)
    w = weights("bf16", 64, 48, 2).to(device)
    packed = kernel.pack_gate_up(w, weights("bf16", 64, 48, 3).to(device))
    a, gate, up, sa, sg, su = gated_operands("int8", 9, 64, 48, device)
    b = kernel.pack_gate_up(gate, up).to(device).t()
    sb = kernel.pack_gate_up(sg, su).to(device)

    def fn(x, w, packed, a, b, sa, sb):
        return (
            kernel.linear_act(x, w, None, "gelu_tanh"),
            kernel.linear_gated(x, packed),
            kernel.cutlass_scaled_mm_gated(a, b, sa, sb, torch.float16, "gelu"),
        )

    args = (x, w, packed, a, b, sa, sb)
    eager = fn(*args)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(*args)
    for g, e in zip(compiled, eager):
        assert torch.equal(g, e)
