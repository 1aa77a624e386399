"""Sweep of the W8A8 scaled GEMMs (cutlass_scaled_mm) against cuBLAS and torch, same run (CUDA).

    python quant/benchmarks/gemm_sweep.py [--quick] [--budget-s S] [--out PATH]

Loads the *built* kernel (quant/build, via kernels.get_local_kernel). Shapes: the linear layers
of Llama-3-8B and Qwen3-8B (K -> N) at M = 1 … 8192 tokens, and the squares 4096³ and 8192³.
Per shape, on the same inputs, it times with CUDA-graph replay (scripts/benchlib.py):

- ours: fp8 per-token x per-channel (the headline, key `ours`), fp8 per-tensor, int8 per-token x
  per-channel, fp8 blockwise (1 x 128 activation groups, 128 x 128 weight blocks) and, on the MLP
  up-projection shapes and the squares, fp8 per-token with a fused silu / gelu_tanh epilogue;
- baselines: bf16 `F.linear` (cuBLAS), `torch._scaled_mm` fp8 per-tensor and row-wise,
  `torch._int_mm` followed by the scaling in eager and under torch.compile (M > 16 only), and the
  unfused pair of each fused epilogue: ours without activation, then torch's F.silu / F.gelu;
- end to end: the per-token fp8 linear as a user pays for it (scaled_fp8_quant per token of the
  bf16 activation, then ours), against bf16 F.linear.

The quantized activation is an input of every GEMM contender (its quantize is not timed), except
in the end-to-end one. Every contender is checked against a float64 reference of its own inputs
before it is timed. Weights are never L2-resident across timed calls: each timed call reads the
next of enough weight copies that together exceed twice the L2 (see `weight_copies`). Writes
benchmarks/results/gemm/<device>.json (device, versions, commit, build id) with a verdict per
bar of the quant GEMM issue (`BARS`), also printed as a PASS / FAIL table. Without a GPU of
compute capability 8.9 or newer, it prints why and exits 0.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F

KERNEL_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(KERNEL_DIR.parent / "scripts"))
import benchlib  # noqa: E402

START = time.perf_counter()
BLOCK = 128  # blockwise fp8: activation groups of 1 x 128, weight blocks of 128 x 128
GATE_BLOCK = 64  # pack_gate_up's interleave: 64 gate rows, then the 64 matching up rows
# Budgets sized for one ~6-minute device call: the full sweep (44 shapes, ~12 contenders each at
# 10 ms of replays per timing) takes about 3 minutes on an H100 by this estimate.
BUDGET_S = {"full": 240.0, "quick": 90.0}
REP_MS = 10


# ---- shapes ----


@dataclasses.dataclass(frozen=True)
class Layer:
    model: str
    name: str
    n: int  # output features
    k: int  # input features


# Llama-3-8B: hidden 4096, 32 / 8 heads of 128, intermediate 14336. Qwen3-8B: hidden 4096,
# 32 / 8 heads of 128, intermediate 12288. qkv = 4096 + 2 * 8 * 128 = 6144 for both, and o is
# 4096 -> 4096 for both: measured once, under both names.
LAYERS = [
    Layer("llama3-8b, qwen3-8b", "qkv", 6144, 4096),
    Layer("llama3-8b, qwen3-8b", "o", 4096, 4096),
    Layer("llama3-8b", "gate_up", 2 * 14336, 4096),
    Layer("llama3-8b", "down", 4096, 14336),
    Layer("qwen3-8b", "gate_up", 2 * 12288, 4096),
    Layer("qwen3-8b", "down", 4096, 12288),
]
TOKENS = [1, 16, 64, 128, 512, 2048, 8192]
QUICK_TOKENS = [1, 16, 2048, 8192]
SQUARES = [4096, 8192]
# Layers followed by an activation in a non-gated MLP: the fused-epilogue contenders run there.
FUSED_LAYERS = {"gate_up", "square"}


@dataclasses.dataclass(frozen=True)
class Case:
    op: str  # "scaled_mm" for every case (benchlib budgets by op)
    model: str
    layer: str
    m: int
    n: int
    k: int


def cases(quick: bool) -> list[Case]:
    """Priority order: the quick subset first (the bars' M buckets on Llama-3-8B and the squares),
    then the rest, so a budget cut drops the least needed rows."""

    def of(layer: Layer, m: int) -> Case:
        return Case("scaled_mm", layer.model, layer.name, m, layer.n, layer.k)

    llama = [layer for layer in LAYERS if "llama" in layer.model]
    first = [of(layer, m) for m in QUICK_TOKENS for layer in llama]
    first += [Case("scaled_mm", "square", "square", s, s, s) for s in SQUARES]
    if quick:
        return first
    rest = [of(layer, m) for layer in LAYERS for m in TOKENS]
    return first + [c for c in rest if c not in first]


# ---- operands ----


def weight_copies(weight_bytes: int, l2_bytes) -> int:
    """How many copies of a weight the timed calls rotate through: enough that the copies
    together exceed twice the L2, so each call reads its weight from DRAM as a decode step
    does (every layer's weight is evicted before it comes round again). 1 without an L2 size."""
    if not l2_bytes:
        return 1
    return min(64, 2 * l2_bytes // weight_bytes + 1)


def quantize_weight_blockwise(w: torch.Tensor):
    """w [N, K] (N, K multiples of 128) -> (fp8 [N, K], scale [N/128, K/128] float32), one scale
    per 128 x 128 block (amax / 448, as the fp8 checkpoints' weight_scale_inv)."""
    n, k = w.shape
    blocks = w.float().reshape(n // BLOCK, BLOCK, k // BLOCK, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-10) / 448.0
    q = (blocks / scale[:, None, :, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.reshape(n, k), scale


@dataclasses.dataclass
class Operands:
    """One case's inputs, every format from the same bf16 activation x [M, K] and weight w [N, K].
    Each weight format is a list of copies (same values, distinct memory) for the L2 rotation;
    B operands are [K, N] column-major views (w.t())."""

    x: torch.Tensor
    a_fp8_token: torch.Tensor
    sa_token: torch.Tensor  # [M, 1]
    a_fp8_tensor: torch.Tensor
    sa_tensor: torch.Tensor  # [1]
    a_int8: torch.Tensor
    sa_int8: torch.Tensor  # [M, 1]
    a_fp8_group: torch.Tensor
    sa_group: torch.Tensor  # [M, K/128], M-major
    bf16: list  # [w]
    fp8_channel: list  # [(b, sb [1, N])]
    fp8_tensor: list  # [(b, sb [1])]
    int8_channel: list  # [(b, sb [1, N])]
    fp8_block: list  # [(b, sb [K/128, N/128])]


def make_operands(kernel, case: Case, device, l2_bytes, generator) -> Operands:
    # Weights of nn.Linear's init scale and unit activations: outputs of order 1, no overflow.
    x = torch.randn(case.m, case.k, generator=generator, device=device).to(torch.bfloat16)
    w = torch.randn(case.n, case.k, generator=generator, device=device) / math.sqrt(case.k)
    w = w.to(torch.bfloat16)
    a_fp8_token, sa_token = kernel.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
    a_fp8_tensor, sa_tensor = kernel.scaled_fp8_quant(x)
    a_int8, sa_int8, _ = kernel.scaled_int8_quant(x)
    # Column-major (M-major) group scales, the layout the blockwise kernel reads without a copy.
    a_fp8_group, sa_group = kernel.per_token_group_quant_fp8(x, BLOCK, column_major_scales=True)
    # Per output channel = per row of w: the per-token quantize of w gives those scales.
    wq8, ws8 = kernel.scaled_fp8_quant(w, use_per_token_if_dynamic=True)
    wqt, wst = kernel.scaled_fp8_quant(w)
    wqi, wsi, _ = kernel.scaled_int8_quant(w)
    wqb, wsb = quantize_weight_blockwise(w)

    def copies(*tensors):
        count = weight_copies(tensors[0].numel() * tensors[0].element_size(), l2_bytes)
        return [tuple(t.clone() for t in tensors) for _ in range(count)]

    return Operands(
        x=x,
        a_fp8_token=a_fp8_token,
        sa_token=sa_token,
        a_fp8_tensor=a_fp8_tensor,
        sa_tensor=sa_tensor,
        a_int8=a_int8,
        sa_int8=sa_int8,
        a_fp8_group=a_fp8_group,
        sa_group=sa_group,
        bf16=[c[0] for c in copies(w)],
        fp8_channel=[(b.t(), s.reshape(1, -1)) for b, s in copies(wq8, ws8)],
        fp8_tensor=[(b.t(), s.reshape(1)) for b, s in copies(wqt, wst)],
        int8_channel=[(b.t(), s.reshape(1, -1)) for b, s in copies(wqi, wsi)],
        # [K/128, N/128] as the transposed view of the checkpoints' [N/128, K/128] (K-major).
        fp8_block=[(b.t(), s.t()) for b, s in copies(wqb, wsb)],
    )


# ---- contenders ----


def int_mm_scaled(a, b, sa, sb):
    """The int8 GEMM torch users write: exact int32 product, then the scales in float32."""
    return (torch._int_mm(a, b).float() * sa * sb).to(torch.bfloat16)


_COMPILED = {}


def compiled(fn):
    """fn compiled once for every shape (dynamic): a compile per shape would not fit the budget."""
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn, dynamic=True)
    return _COMPILED[fn]


def gelu_tanh(y):
    return F.gelu(y, approximate="tanh")


ACTIVATIONS = {"silu": F.silu, "gelu_tanh": gelu_tanh}


@dataclasses.dataclass(frozen=True)
class Contender:
    weights: str  # the Operands field of the weight copies it reads
    run: object  # run(weight) -> output [M, N]; weight is one element of that list
    reference: object  # reference(weight, rows) -> float64 [len(rows), N]: those output rows
    activation: str | None = None  # applied to the reference, as the contender applies it
    gated: bool = False  # output [M, N/2]: activation(gate blocks) * up blocks


def contenders(kernel, case: Case, ops: Operands, *, block_fp8: bool, with_compile: bool):
    """name -> Contender for `case`; `ours` is fp8 per-token x per-channel. A contender that
    cannot run the case (int8 `_int_mm` at M <= 16, blockwise fp8 before sm90) is absent."""
    bf16 = torch.bfloat16
    mm = kernel.cutlass_scaled_mm

    def ref_scaled(a, sa):
        # sum_k a[m, k] b[k, n] * sa * sb in float64: exact products and sums at these sizes
        # (|a b| <= 448^2 or 127^2, K <= 14336: far below 2^53).
        def reference(wb, rows):
            sa_rows = sa[rows] if sa.numel() > 1 else sa
            return (a[rows].double() @ wb[0].double()) * sa_rows.double() * wb[1].double()

        return reference

    ref_token = ref_scaled(ops.a_fp8_token, ops.sa_token)
    out = {
        "bf16": Contender(
            "bf16",
            lambda w: F.linear(ops.x, w),
            lambda w, rows: ops.x[rows].double() @ w.double().t(),
        ),
        "ours": Contender(
            "fp8_channel",
            lambda wb: mm(ops.a_fp8_token, wb[0], ops.sa_token, wb[1], bf16),
            ref_token,
        ),
        "ours_fp8_tensor": Contender(
            "fp8_tensor",
            lambda wb: mm(ops.a_fp8_tensor, wb[0], ops.sa_tensor, wb[1], bf16),
            ref_scaled(ops.a_fp8_tensor, ops.sa_tensor),
        ),
        "ours_int8": Contender(
            "int8_channel",
            lambda wb: mm(ops.a_int8, wb[0], ops.sa_int8, wb[1], bf16),
            ref_scaled(ops.a_int8, ops.sa_int8),
        ),
        "scaled_mm_tensor": Contender(
            "fp8_tensor",
            lambda wb: torch._scaled_mm(
                ops.a_fp8_tensor, wb[0], ops.sa_tensor, wb[1], out_dtype=bf16
            ),
            ref_scaled(ops.a_fp8_tensor, ops.sa_tensor),
        ),
        "scaled_mm_row": Contender(
            "fp8_channel",
            lambda wb: torch._scaled_mm(
                ops.a_fp8_token, wb[0], ops.sa_token, wb[1], out_dtype=bf16
            ),
            ref_token,
        ),
        # cuBLAS with the accumulation ours uses on Hopper (no float32 promotion over K).
        "scaled_mm_tensor_fast": Contender(
            "fp8_tensor",
            lambda wb: torch._scaled_mm(
                ops.a_fp8_tensor, wb[0], ops.sa_tensor, wb[1], out_dtype=bf16, use_fast_accum=True
            ),
            ref_scaled(ops.a_fp8_tensor, ops.sa_tensor),
        ),
        "scaled_mm_row_fast": Contender(
            "fp8_channel",
            lambda wb: torch._scaled_mm(
                ops.a_fp8_token, wb[0], ops.sa_token, wb[1], out_dtype=bf16, use_fast_accum=True
            ),
            ref_token,
        ),
        # What a user pays per linear layer: the dynamic per-token quantize, then the GEMM.
        "e2e_ours": Contender(
            "fp8_channel",
            lambda wb: mm(*_quantized_token(kernel, ops.x, wb), bf16),
            ref_token,
        ),
    }
    if block_fp8:
        out["ours_fp8_block"] = Contender(
            "fp8_block",
            lambda wb: mm(ops.a_fp8_group, wb[0], ops.sa_group, wb[1], bf16),
            lambda wb, rows: _block_reference(ops.a_fp8_group[rows], ops.sa_group[rows], *wb),
        )
    if case.m > 16:  # torch._int_mm needs M > 16
        ref_int = ref_scaled(ops.a_int8, ops.sa_int8)
        out["int_mm_eager"] = Contender(
            "int8_channel", lambda wb: int_mm_scaled(ops.a_int8, wb[0], ops.sa_int8, wb[1]), ref_int
        )
        if with_compile:
            int_mm_compiled = compiled(int_mm_scaled)
            out["int_mm_compile"] = Contender(
                "int8_channel",
                lambda wb: int_mm_compiled(ops.a_int8, wb[0], ops.sa_int8, wb[1]),
                ref_int,
            )
    if case.layer in FUSED_LAYERS:
        for name, act in ACTIVATIONS.items():
            out[f"ours_{name}"] = Contender(
                "fp8_channel",
                lambda wb, name=name: mm(
                    ops.a_fp8_token, wb[0], ops.sa_token, wb[1], bf16, activation=name
                ),
                ref_token,
                name,
            )
            out[f"unfused_{name}"] = Contender(
                "fp8_channel",
                lambda wb, act=act: act(mm(ops.a_fp8_token, wb[0], ops.sa_token, wb[1], bf16)),
                ref_token,
                name,
            )
    if case.layer == "gate_up":
        # The gated MLP form on the same weight read as packed gate / up blocks, against the
        # GEMM to [M, 2N] followed by act(g) * u (compiled into one kernel when compile runs).
        gate_mul = compiled(gate_mul_silu) if with_compile else gate_mul_silu
        out["ours_gated_silu"] = Contender(
            "fp8_channel",
            lambda wb: kernel.cutlass_scaled_mm_gated(
                ops.a_fp8_token, wb[0], ops.sa_token, wb[1], bf16, activation="silu"
            ),
            ref_token,
            "silu",
            gated=True,
        )
        out["unfused_gated_silu"] = Contender(
            "fp8_channel",
            lambda wb: gate_mul(mm(ops.a_fp8_token, wb[0], ops.sa_token, wb[1], bf16)),
            ref_token,
            "silu",
            gated=True,
        )
    return out


def gate_mul(y: torch.Tensor, act) -> torch.Tensor:
    """act(g) * u of a product [M, 2N] over a packed gate / up weight (blocks of GATE_BLOCK
    columns, gate first), in y's dtype."""
    m, two_n = y.shape
    blocks = y.view(m, two_n // (2 * GATE_BLOCK), 2, GATE_BLOCK)
    return (act(blocks[:, :, 0]) * blocks[:, :, 1]).reshape(m, two_n // 2)


def gate_mul_silu(y: torch.Tensor) -> torch.Tensor:
    """The epilogue a caller runs without the gated form."""
    return gate_mul(y, F.silu)


def _quantized_token(kernel, x, wb):
    """(a, b, scale_a, scale_b) of cutlass_scaled_mm with `x` quantized per token now."""
    a, sa = kernel.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
    return a, wb[0], sa, wb[1]


def _block_reference(a, sa, b, sb):
    """Blockwise: a [M, K] with sa [M, K/128], b [K, N] with sb [K/128, N/128]; each scale
    multiplies its block's elements, in float64."""
    a64 = a.double() * sa.double().repeat_interleave(BLOCK, dim=1)
    s = sb.double().repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)
    return a64 @ (b.double() * s[:, : b.shape[1]])


# ---- verification and timing ----


def check_rows(m: int, count: int = 32) -> torch.Tensor:
    """The output rows verified (up to `count`, spread over M, first and last included): a
    float64 reference of every row of an 8192-row case would cost more than timing it."""
    return torch.linspace(0, m - 1, min(m, count)).round().long().unique()


def verify(name: str, contender: Contender, ops: Operands, case: Case) -> None:
    """The contender's output on the first weight copy against its float64 reference.

    Tolerance (benchlib.check_close, in ulps of bf16, eps = 2^-7), |got - want| <= u * eps *
    |want| + 8 * eps * rms(want):
    - u = 1: the output is rounded once (0.5 ulp) after float32 scaling (2^-23 per rounding).
      With an activation u = 2: the unfused pair rounds to bf16 twice, and a fused epilogue
      may use approximate transcendentals (tanh.approx: 2^-11 relative).
    - 8 ulps of the rms: the accumulation. Hopper's fp8 tensor cores keep about 14 bits in
      the accumulator unless the kernel promotes partial sums to float32 (DeepSeek-V3 report;
      cuBLAS / CUTLASS "fast accumulation"). Rounding at 2^-14 of a random-walk partial sum
      over K terms gives an error of about 2^-14 * sqrt(K / 2) * rms: 0.66 ulp at K = 14336,
      and near 5 sigma = 3.3 ulps as the maximum over the ~10^6 elements checked; 8 leaves
      room. A wrong result (a scale or layout mix-up, a missing epilogue) is off by a
      large fraction of the rms, far above 8 ulps (6%)."""
    rows = check_rows(case.m).to(ops.x.device)
    weight = getattr(ops, contender.weights)[0]
    got = contender.run(weight)
    cols = case.n // 2 if contender.gated else case.n
    if tuple(got.shape) != (case.m, cols) or got.dtype != torch.bfloat16:
        raise SystemExit(f"verification failed for {name} {case}: {got.dtype} {list(got.shape)}")
    want = contender.reference(weight, rows)
    ulps, rms_ulps = 1.0, 8.0
    if contender.gated:
        want = gate_mul(want, ACTIVATIONS[contender.activation])
        # Both factors carry the accumulation error: twice the rms allowance.
        ulps, rms_ulps = 3.0, 16.0
    elif contender.activation is not None:
        want = ACTIVATIONS[contender.activation](want)
        ulps = 2.0
    benchlib.check_close(f"{name} {case}", got[rows], want, ulps=ulps, rms_ulps=rms_ulps)


def rotated_time_us(contender: Contender, copies: list) -> float:
    """GPU time of one call: a captured call runs the contender once on every weight copy in
    turn, and the replay's median is divided by the number of copies."""

    def every_copy():
        for weight in copies:
            contender.run(weight)

    return benchlib.gpu_time_us(every_copy, rep_ms=REP_MS) / len(copies)


# ---- results ----

# (ratio key, ours, baseline): speed-up = baseline time / ours (above 1: ours is faster).
RATIOS = [
    ("fp8_token_vs_bf16", "ours", "bf16"),
    ("fp8_tensor_vs_bf16", "ours_fp8_tensor", "bf16"),
    ("int8_vs_bf16", "ours_int8", "bf16"),
    ("fp8_token_vs_scaled_mm_row", "ours", "scaled_mm_row"),
    ("fp8_token_vs_scaled_mm_row_fast", "ours", "scaled_mm_row_fast"),
    ("fp8_tensor_vs_scaled_mm_tensor_fast", "ours_fp8_tensor", "scaled_mm_tensor_fast"),
    ("fp8_tensor_vs_scaled_mm_tensor", "ours_fp8_tensor", "scaled_mm_tensor"),
    ("int8_vs_int_mm_eager", "ours_int8", "int_mm_eager"),
    ("int8_vs_int_mm_compile", "ours_int8", "int_mm_compile"),
    ("block_vs_scaled_mm_tensor", "ours_fp8_block", "scaled_mm_tensor"),
    ("silu_fused_vs_unfused", "ours_silu", "unfused_silu"),
    ("gelu_tanh_fused_vs_unfused", "ours_gelu_tanh", "unfused_gelu_tanh"),
    ("gated_silu_fused_vs_unfused", "ours_gated_silu", "unfused_gated_silu"),
    ("e2e_fp8_token_vs_bf16", "e2e_ours", "bf16"),
]

# (bar, ratio keys (the worst counts), which M, threshold): the quant GEMM issue's bars. For
# int8 against _int_mm, the faster baseline (eager or compiled) counts.
BARS = [
    (
        "fp8 per-tensor >= 1.0x _scaled_mm per-tensor, every M",
        ["fp8_tensor_vs_scaled_mm_tensor"],
        "all",
        1.0,
    ),
    (
        "fp8 per-token >= 1.0x _scaled_mm row-wise, every M",
        ["fp8_token_vs_scaled_mm_row"],
        "all",
        1.0,
    ),
    # The same two bars against cuBLAS in the accumulation mode ours uses on Hopper.
    (
        "fp8 per-tensor >= 1.0x _scaled_mm per-tensor fast accum, every M",
        ["fp8_tensor_vs_scaled_mm_tensor_fast"],
        "all",
        1.0,
    ),
    (
        "fp8 per-token >= 1.0x _scaled_mm row-wise fast accum, every M",
        ["fp8_token_vs_scaled_mm_row_fast"],
        "all",
        1.0,
    ),
    (
        "fp8 >= 1.6x bf16 F.linear, M >= 4096",
        ["fp8_tensor_vs_bf16", "fp8_token_vs_bf16"],
        "prefill",
        1.6,
    ),
    (
        "fp8 >= 1.7x bf16 F.linear, M <= 16",
        ["fp8_tensor_vs_bf16", "fp8_token_vs_bf16"],
        "decode",
        1.7,
    ),
    (
        "int8 >= 1.0x _int_mm + scaling, M >= 64",
        ["int8_vs_int_mm_eager", "int8_vs_int_mm_compile"],
        "m64",
        1.0,
    ),
    ("int8 >= 1.7x bf16 F.linear, M <= 16", ["int8_vs_bf16"], "decode", 1.7),
    (
        "blockwise >= 0.9x _scaled_mm per-tensor, M >= 2048",
        ["block_vs_scaled_mm_tensor"],
        "m2048",
        0.9,
    ),
    (
        "fused >= 1.0x unfused, every M",
        ["silu_fused_vs_unfused", "gelu_tanh_fused_vs_unfused", "gated_silu_fused_vs_unfused"],
        "all",
        1.0,
    ),
]
BAR_M = {
    "all": lambda m: True,
    "prefill": lambda m: m >= 4096,
    "decode": lambda m: m <= 16,
    "m64": lambda m: m >= 64,
    "m2048": lambda m: m >= 2048,
}


def result_row(case: Case, us: dict) -> dict:
    """The case, µs / TFLOP/s / weight GB/s per contender (None where it did not run), the
    speed-ups of RATIOS. `gbs` is the weight read per second: what bounds decode sizes."""
    flop = 2 * case.m * case.n * case.k
    weight_bytes = {name: case.n * case.k * (2 if name == "bf16" else 1) for name in us}
    ratio = {
        key: us[base] / us[ours] if us.get(ours) and us.get(base) else None
        for key, ours, base in RATIOS
    }
    return {
        **dataclasses.asdict(case),
        "flops": flop,
        "us": us,
        "tflops": {k: flop / (v * 1e-6) / 1e12 if v else None for k, v in us.items()},
        "gbs": {k: weight_bytes[k] / (v * 1e-6) / 1e9 if v else None for k, v in us.items()},
        "speedup": ratio,
    }


def bar_verdicts(results: list[dict]) -> list[dict]:
    """Per bar and M bucket: the worst ratio over the bar's rows and keys, its shape, PASS / FAIL
    (None: no row measured it)."""
    verdicts = []
    for bar, keys, which, threshold in BARS:
        buckets = sorted({r["m"] for r in results if BAR_M[which](r["m"])})
        for m in buckets or [None]:
            worst = None
            for r in results:
                if r["m"] != m:
                    continue
                for key in keys:
                    v = r["speedup"].get(key)
                    if v is not None and (worst is None or v < worst[0]):
                        worst = (v, f"{r['model']} {r['layer']} {r['n']}x{r['k']}", key)
            verdicts.append(
                {
                    "bar": bar,
                    "m": m,
                    "threshold": threshold,
                    "worst": None if worst is None else worst[0],
                    "where": None if worst is None else f"{worst[1]} ({worst[2]})",
                    "pass": None if worst is None else worst[0] >= threshold,
                }
            )
    return verdicts


def verdict_lines(verdicts: list[dict]) -> list[str]:
    lines = []
    for v in verdicts:
        state = "n/a " if v["pass"] is None else "PASS" if v["pass"] else "FAIL"
        worst = "   -  " if v["worst"] is None else f"{v['worst']:5.2f}x"
        lines.append(f"{state}  {v['bar']:55s} M={v['m']!s:5s} worst {worst}  {v['where'] or ''}")
    return lines


# ---- the sweep ----


def block_fp8_supported(kernel, device) -> bool:
    if torch.device(device).type != "cuda":
        return True
    major, minor = torch.cuda.get_device_capability(device)
    check = getattr(kernel, "cutlass_scaled_mm_supports_block_fp8", None)
    return check(10 * major + minor) if check else major >= 9


def prepare(kernel, case: Case, l2_bytes, *, device, with_compile: bool):
    """The case's operands and its verified contenders. A torch baseline that fails (a compile
    error, a shape cuBLAS rejects) is dropped with a note, so one baseline cannot cost the run;
    a failure of ours stops the sweep."""
    generator = torch.Generator(device=device).manual_seed(zlib.crc32(repr(case).encode()))
    ops = make_operands(kernel, case, device, l2_bytes, generator)
    each = contenders(
        kernel, case, ops, block_fp8=block_fp8_supported(kernel, device), with_compile=with_compile
    )
    failed = {}
    for name, contender in list(each.items()):
        try:
            verify(name, contender, ops, case)
        # SystemExit too: a baseline that fails verification is dropped, not the whole run.
        except (Exception, SystemExit) as error:
            if name.startswith(OURS_PREFIXES):
                raise
            failed[name] = f"{type(error).__name__}: {error}"[:300]
            print(f"note: {name} dropped for {case}: {failed[name]}", flush=True)
            del each[name]
    return ops, each, failed


def run_case(kernel, case: Case, l2_bytes, *, device="cuda", with_compile=True) -> dict:
    ops, each, failed = prepare(kernel, case, l2_bytes, device=device, with_compile=with_compile)
    us = {name: None for name in CONTENDERS}
    for name, contender in each.items():
        us[name] = rotated_time_us(contender, getattr(ops, contender.weights))
    row = result_row(case, us)
    row["weight_copies"] = {name: len(getattr(ops, c.weights)) for name, c in each.items()}
    if failed:
        row["failed"] = failed
    return row


# Ours (a failure stops the sweep) are the contenders named with these prefixes.
OURS_PREFIXES = ("ours", "e2e_ours", "unfused_")
CONTENDERS = [
    "ours",
    "ours_fp8_tensor",
    "ours_int8",
    "ours_fp8_block",
    "ours_silu",
    "ours_gelu_tanh",
    "ours_gated_silu",
    "e2e_ours",
    "bf16",
    "scaled_mm_tensor",
    "scaled_mm_row",
    "scaled_mm_tensor_fast",
    "scaled_mm_row_fast",
    "int_mm_eager",
    "int_mm_compile",
    "unfused_silu",
    "unfused_gelu_tanh",
    "unfused_gated_silu",
]


def summary(r: dict) -> str:
    s = r["speedup"]

    def x(key):
        return "  -  " if s.get(key) is None else f"{s[key]:5.2f}"

    return (
        f"{r['layer']:8s} M={r['m']:5d} N={r['n']:5d} K={r['k']:5d}  ours {r['us']['ours']:9.2f} us "
        f"{r['tflops']['ours']:7.1f} TFLOP/s  vs bf16 {x('fp8_token_vs_bf16')}  "
        f"vs _scaled_mm row {x('fp8_token_vs_scaled_mm_row')} / tensor "
        f"{x('fp8_tensor_vs_scaled_mm_tensor')}  int8 vs _int_mm {x('int8_vs_int_mm_eager')} / "
        f"{x('int8_vs_int_mm_compile')}  block {x('block_vs_scaled_mm_tensor')}  "
        f"fused {x('silu_fused_vs_unfused')}  e2e {x('e2e_fp8_token_vs_bf16')}"
    )


NOTES = {
    "suite": "gemm",
    "method": "GPU time = median of CUDA-graph replay (triton do_bench_cudagraph) of the public "
    "function (output allocation included, for every contender); each captured call runs the "
    "contender once per weight copy, rotating through enough copies that they exceed twice the "
    "L2 (no weight is L2-resident across calls), and the time is divided by the copies; "
    "quantized activations are inputs (not timed) except in e2e_ours; every contender verified "
    "against a float64 reference of its inputs first (32 rows); TFLOP/s = 2MNK / t; GB/s = "
    "weight bytes / t (bf16: 2 bytes per weight, fp8 / int8: 1)",
    "baselines": "bf16 = F.linear (cuBLAS); scaled_mm_tensor / scaled_mm_row = torch._scaled_mm "
    "fp8 with per-tensor / row-wise (per-token x per-channel) scales, bf16 out, and *_fast the "
    "same with use_fast_accum=True (the accumulation ours uses on Hopper); int_mm_eager / "
    "int_mm_compile = torch._int_mm then float32 scaling to bf16, eager and torch.compile "
    "(dynamic); unfused_<act> = ours fp8 per-token then F.silu / F.gelu(approximate='tanh'); "
    "ours_gated_silu = cutlass_scaled_mm_gated on the gate_up weight read as packed blocks, "
    "unfused_gated_silu = ours to [M, 2N] then silu(g) * u (torch.compile, one kernel); "
    "e2e_ours = scaled_fp8_quant per token + ours, against bf16",
}


def main() -> int:
    args = benchlib.sweep_arguments(
        __doc__.splitlines()[0],
        "Llama-3-8B layers at M 1, 16, 2048, 8192 and the squares",
        BUDGET_S,
    ).parse_args()
    if not torch.cuda.is_available():
        print("gemm_sweep: skipped, the GEMM sweep times CUDA kernels and no GPU is available")
        return 0
    if torch.cuda.get_device_capability() < (8, 9):
        print("gemm_sweep: skipped, fp8 needs a GPU of compute capability 8.9 or newer")
        return 0
    torch._dynamo.config.cache_size_limit = 64
    path, payload = benchlib.run_budgeted_sweep(
        kernel_name="quant",
        kernel_dir=KERNEL_DIR,
        start=START,
        args=args,
        budget_s=BUDGET_S,
        cases=cases(args.quick),
        run_case=run_case,
        summary=summary,
        sort_key=lambda r: (r["layer"], r["n"], r["k"], r["m"]),
        notes=NOTES,
        results_subdir="gemm",
    )
    payload["bars"] = bar_verdicts(payload["results"])
    benchlib.save(path, payload)
    print("\n".join(["bars of the quant GEMM issue:", *verdict_lines(payload["bars"])]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
