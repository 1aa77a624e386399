"""The int4 weight-only ops: our packed layout (checked against its specification word by word),
the GPTQ / AWQ round trips (bit-exact), and w4a16_gemm against a float64 product of the
dequantized weight, with bounds derived from float32 accumulation and one final rounding.

Inputs are made on the CPU and moved to `device` for the op; references stay on the CPU."""

import pytest
import torch
from quant_op_conformance import assert_only_declared_arguments_change, opcheck_all

DTYPES = (torch.float16, torch.bfloat16)
# Unit roundoff of each dtype (half an ulp at 1) and of float32.
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
F32_ROUNDOFF = 2.0**-24


@pytest.fixture
def dev(int4_device):
    """Moves tensors (or None) to the device under test."""

    def move(*ts):
        moved = [None if t is None else t.to(int4_device) for t in ts]
        return moved[0] if len(moved) == 1 else moved

    return move


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_codes(k: int, n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 16, (k, n), generator=gen(seed), dtype=torch.uint8)


# ---- the layout against its specification (kernel_src/w4a16_layout.h) ----


def spec_pack(codes: torch.Tensor) -> torch.Tensor:
    """The layout written out from its description, in the other direction from the kernel's
    position_of: for every tile, lane, word and nibble, the (k, n) it holds."""
    k_all, n_all = codes.shape
    words = torch.zeros((k_all // 16, 2 * n_all), dtype=torch.int64)
    for kt in range(k_all // 16):
        for nt in range(n_all // 64):
            base = nt * 128
            for lane in range(32):
                c = lane % 4
                for j in range(4):
                    word = 0
                    for p in range(8):
                        k = kt * 16 + 2 * c + (p >> 2) + 8 * (p & 1)
                        f = 2 * j + ((p >> 1) & 1)
                        n = nt * 64 + 8 * f + lane // 4
                        word |= int(codes[k, n]) << (4 * p)
                    words[kt, base + lane * 4 + j] = word
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def test_pack_matches_the_layout_spec(kernel, dev):
    codes = random_codes(32, 128, seed=1)
    assert torch.equal(kernel.int4_pack(dev(codes)).cpu(), spec_pack(codes))


def test_pack_puts_mma_fragment_pairs_in_half_words(kernel, dev):
    """(word >> 4 i) & 0x000F000F holds B-fragment elements (b0, b1) / (b2, b3) of the lane's
    n8 blocks: rows (2c, 2c+1) and (2c+8, 2c+9) of column 8 f + lane / 4."""
    codes = random_codes(16, 64, seed=2)
    words = kernel.int4_pack(dev(codes)).view(-1).tolist()
    for lane in range(32):
        c, col = lane % 4, lane // 4
        for j in range(4):
            w = words[lane * 4 + j] & 0xFFFFFFFF
            for i in range(4):
                f = 2 * j + i // 2
                rows = (2 * c, 2 * c + 1) if i % 2 == 0 else (2 * c + 8, 2 * c + 9)
                pair = (w >> (4 * i)) & 0x000F000F
                got = (pair & 0xF, pair >> 16)
                assert got == (int(codes[rows[0], 8 * f + col]), int(codes[rows[1], 8 * f + col]))


@pytest.mark.parametrize("shape", [(16, 64), (48, 192), (128, 320), (0, 64), (16, 0)], ids=str)
def test_pack_round_trip(kernel, dev, shape):
    codes = dev(random_codes(*shape, seed=3))
    packed = kernel.int4_pack(codes)
    assert packed.shape == (shape[0] // 16, 2 * shape[1])
    assert torch.equal(kernel.int4_unpack(packed), codes)


def test_pack_reads_a_strided_view(kernel, dev):
    wide = dev(random_codes(32, 256, seed=4))
    view = wide[:, 64:192]
    assert torch.equal(kernel.int4_pack(view), kernel.int4_pack(view.contiguous()))


# ---- checkpoint formats ----


def gptq_checkpoint(k: int, n: int, group: int, act_order: bool, seed: int):
    """A GPTQ-format (qweight, scales, g_idx) and the codes it holds, packed here from the format's
    definition: the code of row k in bits 4 (k % 8) of qweight[k // 8]."""
    codes = random_codes(k, n, seed)
    qweight = torch.zeros((k // 8, n), dtype=torch.int64)
    for i in range(8):
        qweight |= codes[i::8].to(torch.int64) << (4 * i)
    qweight = torch.where(qweight >= 2**31, qweight - 2**32, qweight).to(torch.int32)
    groups = torch.arange(k) // group
    g_idx = groups[torch.randperm(k, generator=gen(seed + 1))] if act_order else groups
    scales = torch.rand((k // group, n), generator=gen(seed + 2)) * 0.02 + 0.001
    return qweight, scales, g_idx.to(torch.int32), codes


def awq_checkpoint(k: int, n: int, group: int, seed: int):
    """An AWQ-format (qweight, qzeros, scales) and its codes and zeros: the code of column
    8 c + order[i] in bits 4 i of word c, order = (0, 2, 4, 6, 1, 3, 5, 7)."""
    order = (0, 2, 4, 6, 1, 3, 5, 7)
    codes = random_codes(k, n, seed)
    zeros = random_codes(k // group, n, seed + 1)

    def pack(t):
        out = torch.zeros((t.shape[0], t.shape[1] // 8), dtype=torch.int64)
        for i in range(8):
            out |= t[:, order[i] :: 8].to(torch.int64) << (4 * i)
        return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)

    scales = torch.rand((k // group, n), generator=gen(seed + 2)) * 0.02 + 0.001
    return pack(codes), pack(zeros), scales, codes, zeros


@pytest.mark.parametrize("act_order", [False, True], ids=["ordered", "act_order"])
def test_gptq_round_trip(kernel, dev, act_order):
    qweight, _, g_idx, codes = dev(*gptq_checkpoint(256, 192, 64, act_order, seed=5))
    packed, perm = kernel.gptq_repack(qweight, g_idx)
    assert (perm is not None) == act_order
    if act_order:
        assert torch.equal(g_idx[perm.long()], g_idx.sort().values)  # groups made contiguous
        assert torch.equal(kernel.int4_unpack(packed), codes[perm.long()])
    else:
        assert torch.equal(kernel.int4_unpack(packed), codes)
    assert torch.equal(kernel.gptq_unrepack(packed, perm), qweight)


def test_awq_round_trip(kernel, dev):
    qweight, qzeros, _, codes, zeros = dev(*awq_checkpoint(128, 320, 32, seed=6))
    packed = kernel.awq_repack(qweight)
    assert torch.equal(kernel.int4_unpack(packed), codes)
    assert torch.equal(kernel.awq_unrepack(packed), qweight)
    assert torch.equal(kernel.awq_zeros(qzeros, torch.bfloat16), zeros.to(torch.bfloat16))


# ---- the GEMM ----


def reference(a, codes, scales, zeros, perm, bias, dtype):
    """float64 a[..., perm] @ w + bias with w = (q - z) * s (exact), and the error bound of a float32
    sum of K products rounded once to dtype: K * u32 * sum |a w| + u * |ref| (+ the smallest
    normal's half ulp, for results near 0)."""
    k = codes.shape[0]
    group = k // scales.shape[0]
    s = scales.double().repeat_interleave(group, 0)
    z = zeros.double().repeat_interleave(group, 0) if zeros is not None else 8.0
    w = (codes.double() - z) * s
    a2 = a.double()[..., perm.long()] if perm is not None else a.double()
    ref = a2 @ w
    if bias is not None:
        ref = ref + bias.double()
    bound = k * F32_ROUNDOFF * (a2.abs() @ w.abs()) + UNIT_ROUNDOFF[dtype] * ref.abs() + 2.0**-24
    return ref, bound


def make_case(m, k, n, group, dtype, zeros, act_order, bias, seed):
    codes = random_codes(k, n, seed)
    scales = (torch.rand((k // group, n), generator=gen(seed + 1)) * 0.02 + 0.001).to(dtype)
    z = random_codes(k // group, n, seed + 2).to(dtype) if zeros else None
    perm = torch.randperm(k, generator=gen(seed + 3)).to(torch.int32) if act_order else None
    a = torch.randn((m, k), generator=gen(seed + 4)).to(dtype)
    b = torch.randn(n, generator=gen(seed + 5)).to(dtype) if bias else None
    return a, codes, scales, z, perm, b


def check(kernel, dev, a, codes, scales, zeros, perm, bias, dtype, label):
    on_dev = dev(a, codes, scales, zeros, perm, bias)
    on_dev[1] = kernel.int4_pack(on_dev[1])
    out = kernel.w4a16_gemm(*on_dev).cpu()
    ref, bound = reference(a, codes, scales, zeros, perm, bias, dtype)
    assert out.dtype == dtype and out.shape == ref.shape, label
    err = (out.double() - ref).abs()
    assert bool((err <= bound).all()), (
        f"{label}: max error {err.max():.3g}, bound {bound.max():.3g}"
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group", [32, 64, 128, None], ids=lambda g: f"g{g or 'channel'}")
@pytest.mark.parametrize("fmt", ["gptq", "awq"])
def test_gemm_against_reference(kernel, dev, dtype, group, fmt):
    k, n = 384, 192  # three 128-groups, three 64-column tiles
    for m in (1, 2, 7, 16, 64, 257):
        for act_order, bias in ((False, False), (fmt == "gptq", True)):
            case = make_case(
                m, k, n, group or k, dtype, fmt == "awq", act_order, bias, seed=m + k + n
            )
            check(kernel, dev, *case, dtype, f"m={m} act_order={act_order} bias={bias}")


def test_gemm_writes_every_element_of_out(kernel, dev):
    """Through the raw op into a NaN-filled view with wider rows: every element written, the
    padding left alone."""
    a, codes, scales, zeros, perm, bias = make_case(
        5, 128, 128, 64, torch.bfloat16, True, True, True, 7
    )
    buf = dev(torch.full((5, 200), float("nan"), dtype=torch.bfloat16))
    packed = kernel.int4_pack(dev(codes))
    kernel.ops.w4a16_gemm(buf[:, :128], dev(a), packed, *dev(scales, zeros, perm, bias), "none")
    ref, bound = reference(a, codes, scales, zeros, perm, bias, torch.bfloat16)
    buf = buf.cpu()
    assert bool(((buf[:, :128].double() - ref).abs() <= bound).all())
    assert bool(buf[:, 128:].isnan().all())


def test_gemm_strided_and_batched_activations(kernel, dev):
    dtype = torch.float16
    a, codes, scales, zeros, perm, bias = make_case(6, 128, 64, 32, dtype, False, False, False, 8)
    wide = torch.randn((6, 300), generator=gen(9)).to(dtype)
    wide[:, 100:228] = a
    check(kernel, dev, wide[:, 100:228], codes, scales, zeros, perm, bias, dtype, "row stride 300")
    # Rows starting on odd elements (2-byte aligned): the GPU reads them one element at a time.
    odd = torch.randn((6, 301), generator=gen(10)).to(dtype)
    odd[:, 101:229] = a
    check(kernel, dev, odd[:, 101:229], codes, scales, zeros, perm, bias, dtype, "odd offset")
    packed, scales_d = kernel.int4_pack(dev(codes)), dev(scales)
    out = kernel.w4a16_gemm(dev(a).reshape(2, 3, 128), packed, scales_d)
    assert out.shape == (2, 3, 64)
    assert torch.equal(out.reshape(6, 64), kernel.w4a16_gemm(dev(a), packed, scales_d))


def test_gemm_empty(kernel, dev):
    dtype = torch.bfloat16
    packed = kernel.int4_pack(dev(random_codes(64, 64, 10)))
    out = kernel.w4a16_gemm(
        dev(torch.empty((0, 64), dtype=dtype)), packed, dev(torch.ones((2, 64), dtype=dtype))
    )
    assert out.shape == (0, 64)
    bias = torch.randn(64, generator=gen(11)).to(dtype)
    empty_k = kernel.int4_pack(dev(random_codes(0, 64, 12)))
    a, scales, bias_d = dev(
        torch.empty((3, 0), dtype=dtype), torch.ones((1, 64), dtype=dtype), bias
    )
    out = kernel.w4a16_gemm(a, empty_k, scales, bias=bias_d)
    assert torch.equal(out.cpu(), bias.expand(3, 64))


# ---- from checkpoints to products ----


@pytest.mark.parametrize("act_order", [False, True], ids=["ordered", "act_order"])
def test_gptq_checkpoint_product(kernel, dev, act_order):
    """x @ W for W as the GPTQ format defines it: (q[k, n] - 8) * scales[g_idx[k], n]."""
    dtype = torch.float16
    qweight, scales, g_idx, codes = gptq_checkpoint(256, 128, 64, act_order, seed=13)
    scales = scales.to(dtype)
    packed, perm = kernel.gptq_repack(*dev(qweight, g_idx))
    x = torch.randn((9, 256), generator=gen(14)).to(dtype)
    w = (codes.double() - 8) * scales.double()[g_idx.long()]
    ref = x.double() @ w
    bound = 256 * F32_ROUNDOFF * (x.double().abs() @ w.abs()) + 2.0**-11 * ref.abs() + 2.0**-24
    out = kernel.w4a16_gemm(dev(x), packed, dev(scales), perm=perm).cpu()
    assert bool(((out.double() - ref).abs() <= bound).all())


def test_awq_checkpoint_product(kernel, dev):
    """x @ W for W as the AWQ format defines it: (q[k, n] - z[k // g, n]) * s[k // g, n]."""
    dtype = torch.bfloat16
    qweight, qzeros, scales, codes, zeros = awq_checkpoint(256, 192, 128, seed=15)
    scales = scales.to(dtype)
    x = torch.randn((4, 256), generator=gen(16)).to(dtype)
    rows = torch.arange(256) // 128
    w = (codes.double() - zeros.double()[rows]) * scales.double()[rows]
    ref = x.double() @ w
    bound = 256 * F32_ROUNDOFF * (x.double().abs() @ w.abs()) + 2.0**-8 * ref.abs() + 2.0**-24
    zeros_d = kernel.awq_zeros(dev(qzeros), dtype)
    out = kernel.w4a16_gemm(dev(x), kernel.awq_repack(dev(qweight)), dev(scales), zeros_d).cpu()
    assert bool(((out.double() - ref).abs() <= bound).all())


# ---- errors, torch.library conformance, compile ----


def test_errors_name_the_argument(kernel, dev, device):
    dtype = torch.bfloat16
    codes = dev(random_codes(64, 128, 17))
    packed = kernel.int4_pack(codes)
    a, scales = dev(torch.randn((2, 64)).to(dtype), torch.ones((2, 128), dtype=dtype))
    with pytest.raises(ValueError, match="codes must be 0..15"):
        kernel.int4_pack(codes + 16)
    with pytest.raises(RuntimeError, match="int4_pack: N must be a multiple of 64"):
        kernel.int4_pack(dev(random_codes(16, 96, 18)))
    with pytest.raises(RuntimeError, match="int4_pack: K must be a multiple of 16"):
        kernel.int4_pack(dev(random_codes(24, 64, 18)))
    with pytest.raises(RuntimeError, match="w4a16_gemm: a must be float16 or bfloat16"):
        kernel.w4a16_gemm(a.float(), packed, scales)
    with pytest.raises(RuntimeError, match="w4a16_gemm: b must have shape"):
        kernel.w4a16_gemm(dev(torch.randn((2, 80)).to(dtype)), packed, scales)
    with pytest.raises(RuntimeError, match="w4a16_gemm: scales must be"):
        kernel.w4a16_gemm(a, packed, scales[:, :64])
    shifted = torch.empty(packed.numel() + 1, dtype=torch.int32, device=packed.device)
    shifted = shifted[1:].view(packed.shape)  # contiguous, 4 bytes past an allocation's start
    with pytest.raises(RuntimeError, match="w4a16_gemm: b must start on a 16-byte boundary"):
        kernel.w4a16_gemm(a, shifted, scales)
    with pytest.raises(RuntimeError, match="w4a16_gemm: scales' rows must split K"):
        kernel.w4a16_gemm(a, packed, dev(torch.ones((3, 128), dtype=dtype)))
    with pytest.raises(RuntimeError, match="w4a16_gemm: scales must be bfloat16"):
        kernel.w4a16_gemm(a, packed, scales.half())
    with pytest.raises(RuntimeError, match="w4a16_gemm: zeros must have shape"):
        kernel.w4a16_gemm(a, packed, scales, dev(torch.ones((1, 128), dtype=dtype)))
    with pytest.raises(RuntimeError, match="w4a16_gemm: bias must have shape"):
        kernel.w4a16_gemm(a, packed, scales, bias=dev(torch.ones(64, dtype=dtype)))
    with pytest.raises(RuntimeError, match="w4a16_gemm: perm must have shape"):
        kernel.w4a16_gemm(a, packed, scales, perm=dev(torch.zeros(63, dtype=torch.int32)))
    if device == "cpu":  # the CPU reads perm's values before anything is written
        bad = torch.tensor([0, 64] + [0] * 62, dtype=torch.int32)
        with pytest.raises(RuntimeError, match=r"w4a16_gemm: perm\[1\] = 64 is outside"):
            kernel.w4a16_gemm(a, packed, scales, perm=bad)
    with pytest.raises(
        ValueError, match="gptq_repack: every group of g_idx must hold the same number of rows"
    ):
        kernel.gptq_repack(
            dev(torch.zeros((8, 64), dtype=torch.int32)), dev(torch.tensor([0] * 63 + [1]))
        )


def _op_cases(kernel, dev):
    codes = dev(random_codes(32, 64, 19))
    packed = kernel.int4_pack(codes)
    a, codes2, scales, zeros, perm, bias = dev(
        *make_case(3, 64, 64, 32, torch.float16, True, True, True, 20)
    )
    out = dev(torch.empty((3, 64), dtype=torch.float16))
    _, g_codes, g_scales, _, _, g_bias = dev(
        *make_case(3, 64, 128, 32, torch.float16, False, False, True, 21)
    )
    gated_out = dev(torch.empty((3, 64), dtype=torch.float16))
    return [
        ("int4_pack", (torch.empty_like(packed), codes)),
        ("int4_unpack", (torch.empty_like(codes), packed)),
        ("w4a16_gemm", (out, a, kernel.int4_pack(codes2), scales, zeros, perm, bias, "silu")),
        ("w4a16_gemm", (out, a, kernel.int4_pack(codes2), scales, None, None, None, "none")),
        (
            "w4a16_gemm_gated",
            (gated_out, a, kernel.int4_pack(g_codes), g_scales, None, None, g_bias, "gelu"),
        ),
    ]


def test_opcheck(kernel, dev):
    opcheck_all(kernel, _op_cases(kernel, dev))


def test_only_declared_arguments_change(kernel, dev):
    assert_only_declared_arguments_change(kernel, _op_cases(kernel, dev))


def test_compile_fullgraph(kernel, dev):
    dtype = torch.bfloat16
    a, codes, scales, zeros, perm, bias = dev(
        *make_case(4, 128, 128, 64, dtype, True, True, True, 21)
    )
    packed = kernel.int4_pack(codes)

    def f(x):
        return kernel.w4a16_gemm(x * 2, packed, scales, zeros, perm, bias)

    torch._dynamo.reset()
    assert torch.equal(torch.compile(f, fullgraph=True)(a), f(a))


def test_split_k_is_deterministic_and_graph_safe(kernel, dev, device):
    """A decode shape the GPU splits over K (few output tiles, long K): reruns give the same bits,
    and replays of a captured call match eager calls."""
    dtype = torch.bfloat16
    a, codes, scales, zeros, perm, bias = make_case(
        1, 4096, 128, 128, dtype, False, False, True, 23
    )
    check(kernel, dev, a, codes, scales, zeros, perm, bias, dtype, "split K")
    packed = kernel.int4_pack(dev(codes))
    a_d, scales_d, bias_d = dev(a, scales, bias)
    first = kernel.w4a16_gemm(a_d, packed, scales_d, bias=bias_d)
    assert torch.equal(kernel.w4a16_gemm(a_d, packed, scales_d, bias=bias_d), first)
    if device != "cuda":
        return
    static = a_d.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kernel.w4a16_gemm(static, packed, scales_d, bias=bias_d)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel.w4a16_gemm(static, packed, scales_d, bias=bias_d)
    for seed in (24, 25):
        fresh = dev(torch.randn((1, 4096), generator=gen(seed)).to(dtype))
        static.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, kernel.w4a16_gemm(fresh, packed, scales_d, bias=bias_d))


# ---- fused epilogues: activation, gated MLP ----

ACTIVATIONS_F64 = {
    "gelu": lambda x: 0.5 * x * (1 + torch.erf(x / 2**0.5)),
    "gelu_tanh": lambda x: (
        0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3)))
    ),
    "silu": lambda x: x * torch.sigmoid(x),
}
# The largest slope of each activation (gelu's 1.129 at x = 2.42 bounds all three), which
# carries the float32 sum's error through it.
ACT_SLOPE = 1.13


def sum_and_bound(a, codes, scales, zeros, perm, bias, dtype):
    """float64 sums (with bias) and the float32 accumulation bound, before any rounding to dtype."""
    ref, bound = reference(a, codes, scales, zeros, perm, bias, dtype)
    return ref, bound - UNIT_ROUNDOFF[dtype] * ref.abs()


@pytest.mark.parametrize("activation", list(ACTIVATIONS_F64))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemm_activation(kernel, dev, dtype, activation):
    a, codes, scales, zeros, perm, bias = make_case(7, 384, 192, 64, dtype, True, True, True, 30)
    on = dev(a, codes, scales, zeros, perm, bias)
    on[1] = kernel.int4_pack(on[1])
    out = kernel.w4a16_gemm(*on, activation=activation).cpu().double()
    s, acc_bound = sum_and_bound(a, codes, scales, zeros, perm, bias, dtype)
    want = ACTIVATIONS_F64[activation](s)
    bound = ACT_SLOPE * acc_bound + UNIT_ROUNDOFF[dtype] * want.abs() + 2.0**-24 * 8
    assert bool(((out - want).abs() <= bound).all())


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemm_gated(kernel, dev, dtype, activation):
    """act(a @ w_gate + b_gate) * (a @ w_up + b_up) with gate and up packed by pack_gate_up, K
    split on a GPU (M = 1, K = 4096) and not (M = 17, K = 256)."""
    for m, k in ((17, 256), (1, 4096)):
        gate = make_case(m, k, 128, 128, dtype, True, False, True, 31)
        up = make_case(m, k, 128, 128, dtype, True, False, True, 32)
        a = gate[0]

        def packed(i):  # codes [K, 128], scales / zeros [G, 128], bias [128]: interleave columns
            g, u = gate[i], up[i]
            if g.dim() == 1:
                return kernel.pack_gate_up(g, u)
            return kernel.pack_gate_up(g.t().contiguous(), u.t().contiguous()).t().contiguous()

        codes, scales, zeros, bias = packed(1), packed(2), packed(3), packed(5)
        b = kernel.int4_pack(dev(codes))
        out = kernel.w4a16_gemm_gated(
            dev(a), b, *dev(scales, zeros), bias=dev(bias), activation=activation
        )
        out = out.cpu().double()
        assert out.shape == (m, 128)
        g, g_bound = sum_and_bound(a, gate[1], gate[2], gate[3], None, gate[5], dtype)
        u, u_bound = sum_and_bound(a, up[1], up[2], up[3], None, up[5], dtype)
        act = ACTIVATIONS_F64[activation]
        want = act(g) * u
        bound = (
            ACT_SLOPE * g_bound * u.abs()
            + act(g).abs() * u_bound
            + ACT_SLOPE * g_bound * u_bound
            + UNIT_ROUNDOFF[dtype] * want.abs()
            + 2.0**-24 * 8
        )
        err = (out - want).abs()
        assert bool((err <= bound).all()), f"m={m} k={k}: max error {err.max():.3g}"


def test_gated_errors(kernel, dev):
    dtype = torch.bfloat16
    a = dev(torch.randn((2, 64)).to(dtype))
    b = kernel.int4_pack(dev(random_codes(64, 192, 33)))  # 192 columns: not gate / up pairs
    scales = dev(torch.ones((1, 192), dtype=dtype))
    with pytest.raises(
        RuntimeError, match="w4a16_gemm_gated: a gated b must have a multiple of 128"
    ):
        kernel.w4a16_gemm_gated(a, b, scales)
    with pytest.raises(RuntimeError, match='w4a16_gemm: activation must be one of "none"'):
        kernel.w4a16_gemm(a, b, scales, activation="relu")
