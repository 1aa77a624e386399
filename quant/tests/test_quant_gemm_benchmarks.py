"""benchmarks/gemm_sweep.py, checked without a GPU so that it cannot rot: its shapes are the
issue's, its weight rotation defeats the L2, every contender of a tiny case computes what its
float64 reference says (on the `kernel` fixture's device, through the sweep's own verification),
a wrong GEMM is caught by that verification, and the bars' verdicts follow the numbers. Timing
itself needs CUDA graphs and is left to the GPU run."""

import pytest
import torch
from quant_sweeps import load_benchmark
from test_quant_ops import fp8_capable


@pytest.fixture
def sweep(monkeypatch):
    return load_benchmark(monkeypatch, "gemm_sweep.py")


@pytest.fixture
def fp8_device(device):
    if not fp8_capable(device):
        pytest.skip("float8_e4m3fn needs compute capability 8.9")
    return device


@pytest.fixture
def gemm_kernel(kernel):
    if not hasattr(kernel, "cutlass_scaled_mm"):
        pytest.skip("this build has no cutlass_scaled_mm yet")
    return kernel


class StandIn:
    """The built kernel's quantize ops with cutlass_scaled_mm in float32 torch code, optionally
    wrong in one way: exercises the sweep's plumbing and verification where the op is absent."""

    def __init__(self, kernel, *, gain=1.0, ignore_activation=False, gate_unscaled=False):
        self.kernel, self.gain, self.ignore_activation = kernel, gain, ignore_activation
        self.gate_unscaled = gate_unscaled

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def cutlass_scaled_mm(self, a, b, scale_a, scale_b, out_dtype, bias=None, *, activation=None):
        k, n = b.shape
        if scale_a.dim() == 2 and scale_a.shape[1] == k // 128 > 1:  # blockwise 1x128, 128x128
            sa = scale_a.repeat_interleave(128, dim=1)
            sb = scale_b.repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)[:, :n]
            y = (a.float() * sa) @ (b.float() * sb)
        else:
            y = (a.float() @ b.float()) * scale_a * scale_b
        if activation is not None and not self.ignore_activation:
            y = {"silu": torch.nn.functional.silu, "gelu_tanh": self._gelu_tanh}[activation](y)
        return (y * self.gain).to(out_dtype)

    def cutlass_scaled_mm_gated(self, a, b_packed, scale_a, scale_b, out_dtype, activation="silu"):
        # 64-column gate block, then its up block; gate_unscaled: forgets scale_b on the gate.
        y = a.float() @ b_packed.float() * scale_a
        blocks = y.view(y.shape[0], -1, 2, 64)
        sb = scale_b.reshape(1, -1).expand(1, y.shape[1]).reshape(1, -1, 2, 64)
        gate = blocks[:, :, 0] * (1 if self.gate_unscaled else sb[:, :, 0])
        up = blocks[:, :, 1] * sb[:, :, 1]
        out = torch.nn.functional.silu(gate) * up
        return out.reshape(y.shape[0], -1).to(out_dtype)

    @staticmethod
    def _gelu_tanh(y):
        return torch.nn.functional.gelu(y, approximate="tanh")


def _tiny_case(sweep, m=32, layer="gate_up"):
    # K = 256 (two 128-blocks: blockwise scales are not per-token-shaped), N = 384; M = 32 > 16
    # so the _int_mm baselines are built; gate_up so the fused-epilogue contenders are too.
    return sweep.Case("scaled_mm", "tiny", layer, m, 384, 256)


def test_cases_are_the_issue_shapes(sweep):
    full, quick = sweep.cases(False), sweep.cases(True)
    assert len(full) == len(set(full)) == 6 * 7 + 2
    assert full[: len(quick)] == quick  # a budget cut keeps the quick subset
    assert {c.m for c in full} == {1, 16, 64, 128, 512, 2048, 8192, 4096}
    shapes = {(c.layer, c.n, c.k) for c in full if "llama" in c.model}
    assert shapes == {
        ("qkv", 6144, 4096),
        ("o", 4096, 4096),
        ("gate_up", 28672, 4096),
        ("down", 4096, 14336),
    }
    shapes = {(c.layer, c.n, c.k) for c in full if "qwen" in c.model}
    assert shapes == {
        ("qkv", 6144, 4096),
        ("o", 4096, 4096),
        ("gate_up", 24576, 4096),
        ("down", 4096, 12288),
    }
    assert {(c.m, c.n, c.k) for c in full if c.layer == "square"} == {(4096,) * 3, (8192,) * 3}
    assert all(c.n % 128 == 0 and c.k % 128 == 0 for c in full)  # blockwise needs whole blocks


@pytest.mark.parametrize("weight_mib", [1, 16, 24, 32, 100, 235])
def test_weight_copies_exceed_twice_the_l2(sweep, weight_mib):
    l2, weight = 50 << 20, weight_mib << 20
    copies = sweep.weight_copies(weight, l2)
    assert copies * weight > 2 * l2 and (copies - 1) * weight <= 2 * l2 or copies == 64
    assert sweep.weight_copies(weight, None) == 1


def test_blockwise_weight_quantization(sweep):
    w = torch.randn(256, 384, generator=torch.Generator().manual_seed(3))
    w[:128, :128] *= 100  # blocks of very different range get their own scales
    q, scale = sweep.quantize_weight_blockwise(w)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (2, 3)
    deq = q.float() * scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
    # e4m3 keeps 3 mantissa bits: round to nearest is within 2^-4 relative, and values below
    # its smallest normal (2^-6, times the block's scale) within half a subnormal step (2^-10).
    bound = 2.0**-4 * w.abs() + 2.0**-10 * scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
    assert bool(((deq - w).abs() <= bound).all())
    assert torch.equal(scale[0, 0], w[:128, :128].abs().max() / 448.0)


def _prepare(sweep, kernel, device, case, l2_bytes=None):
    return sweep.prepare(kernel, case, l2_bytes, device=device, with_compile=False)


def test_every_contender_verifies_on_a_tiny_case(sweep, gemm_kernel, fp8_device):
    case = _tiny_case(sweep)
    ops, each, failed = _prepare(sweep, gemm_kernel, fp8_device, case)
    assert failed == {}
    expected = set(sweep.CONTENDERS) - {"int_mm_compile"}
    if not sweep.block_fp8_supported(gemm_kernel, fp8_device):
        expected.discard("ours_fp8_block")
    assert set(each) == expected


def test_stand_in_gemm_runs_the_sweep_plumbing(sweep, kernel, fp8_device):
    """With a correct stand-in every contender verifies; a rotation of several copies gives
    distinct weights; decode sizes have no _int_mm baseline and non-MLP layers no fused one."""
    stand_in = StandIn(kernel)
    case = _tiny_case(sweep)
    weight_bytes = case.n * case.k
    ops, each, failed = _prepare(sweep, stand_in, fp8_device, case, l2_bytes=weight_bytes)
    assert failed == {} and set(each) == set(sweep.CONTENDERS) - {"int_mm_compile"}
    assert len(ops.fp8_channel) == 3 and len(ops.bf16) == 2
    assert len({b.data_ptr() for b, _ in ops.fp8_channel}) == 3
    decode = sweep.Case("scaled_mm", "tiny", "o", 16, 384, 256)
    _, each, _ = _prepare(sweep, stand_in, fp8_device, decode)
    assert not {"int_mm_eager", "ours_silu", "unfused_silu"} & set(each)


@pytest.mark.parametrize(
    "wrong, caught",
    [
        ({"gain": 1.0 + 2.0**-4}, "ours"),
        ({"ignore_activation": True}, "ours_silu"),
        ({"gate_unscaled": True}, "ours_gated_silu"),
    ],
)
def test_verification_catches_a_wrong_gemm(sweep, kernel, fp8_device, wrong, caught):
    """A GEMM 8 bf16 ulps of |result| off (6%), or one that forgets its epilogue, stops the
    sweep (SystemExit naming the contender) instead of being timed."""
    with pytest.raises(SystemExit, match=f"verification failed for {caught} "):
        _prepare(sweep, StandIn(kernel, **wrong), fp8_device, _tiny_case(sweep))


def test_bars_follow_the_numbers(sweep):
    def row(m, ours, scaled_mm_row, bf16):
        us = dict.fromkeys(sweep.CONTENDERS)
        us.update(ours=ours, scaled_mm_row=scaled_mm_row, bf16=bf16)
        return sweep.result_row(sweep.Case("scaled_mm", "x", "o", m, 4096, 4096), us)

    rows = [row(1, 10.0, 11.0, 18.0), row(8192, 100.0, 99.0, 170.0)]
    verdicts = {(v["bar"], v["m"]): v for v in sweep.bar_verdicts(rows)}
    vs_row = "fp8 per-token >= 1.0x _scaled_mm row-wise, every M"
    assert verdicts[(vs_row, 1)]["pass"] and not verdicts[(vs_row, 8192)]["pass"]
    assert verdicts[(vs_row, 8192)]["worst"] == pytest.approx(0.99)
    decode = "fp8 >= 1.7x bf16 F.linear, M <= 16"
    assert verdicts[(decode, 1)]["pass"] and verdicts[(decode, 1)]["worst"] == pytest.approx(1.8)
    assert verdicts[("fp8 >= 1.6x bf16 F.linear, M >= 4096", 8192)]["pass"]
    # no blockwise time anywhere: not measured, neither pass nor fail
    blockwise = [v for v in verdicts.values() if v["bar"].startswith("blockwise")]
    assert [v["pass"] for v in blockwise] == [None]
    assert rows[0]["tflops"]["ours"] == pytest.approx(2 * 4096 * 4096 / 10e-6 / 1e12)
    assert rows[0]["gbs"]["bf16"] == pytest.approx(2 * 4096 * 4096 / 18e-6 / 1e9)


def test_a_failing_baseline_is_dropped_not_fatal(sweep, kernel, fp8_device, monkeypatch):
    """A torch baseline that computes something else is left out of the timing and named in
    the row's `failed`; ours are still verified and timed."""
    real = torch._scaled_mm
    monkeypatch.setattr(torch, "_scaled_mm", lambda *args, **kw: 2 * real(*args, **kw))
    _, each, failed = _prepare(sweep, StandIn(kernel), fp8_device, _tiny_case(sweep))
    scaled_mm = {"scaled_mm_tensor", "scaled_mm_row", "scaled_mm_tensor_fast", "scaled_mm_row_fast"}
    assert set(failed) == scaled_mm
    assert "verification failed for scaled_mm_row" in failed["scaled_mm_row"]
    assert "ours" in each and not scaled_mm & set(each)


def test_run_case_makes_a_result_row(sweep, kernel, fp8_device, monkeypatch):
    """run_case end to end with the timing replaced (CUDA graphs need a GPU): every contender
    gets a time, the ratios and rates follow from them, and summary / bars read the row."""
    timed = []

    def fake_time(contender, copies):
        timed.append(len(copies))
        return 10.0

    monkeypatch.setattr(sweep, "rotated_time_us", fake_time)
    case = _tiny_case(sweep)
    row = sweep.run_case(
        StandIn(kernel), case, 4 * case.n * case.k, device=fp8_device, with_compile=False
    )
    assert row["us"]["int_mm_compile"] is None and row["us"]["ours"] == 10.0
    assert len(timed) == len(sweep.CONTENDERS) - 1
    assert row["weight_copies"]["ours"] == 9 and row["weight_copies"]["bf16"] == 5
    assert row["speedup"]["fp8_token_vs_bf16"] == 1.0
    assert row["speedup"]["int8_vs_int_mm_compile"] is None
    assert row["tflops"]["ours"] == pytest.approx(2 * 32 * 384 * 256 / 10e-6 / 1e12)
    assert "gate_up  M=   32" in sweep.summary(row)
    assert all(v["pass"] in (True, None) for v in sweep.bar_verdicts([row]))
