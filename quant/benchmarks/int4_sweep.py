"""Sweep of the int4 weight-only GEMM (w4a16_gemm) against bf16 cuBLAS and our W8A8, same run (CUDA).

    python quant/benchmarks/int4_sweep.py [--quick] [--budget-s S] [--out PATH]

Loads the *built* kernel (quant/build). Shapes: the decode linears of Llama-3-8B and Qwen3-8B
(K -> N: 4096 -> 6144, 4096 -> 28672, 14336 -> 4096, 4096 -> 4096) and 8192 -> 8192, at M = 1, 4,
16, 32, 64, 128, 256 tokens. Per shape, on the same activations, it times with CUDA-graph replay
(scripts/benchlib.py):

- ours: symmetric int4 in groups of 128 (GPTQ's format, key `ours`) and with zero points (AWQ's,
  `ours_awq`);
- baselines: bf16 `F.linear` (cuBLAS), and our fp8 / int8 W8A8 `cutlass_scaled_mm` on
  pre-quantized activations (per token x per channel; fp8 needs capability 8.9).

Weights are never L2-resident across timed calls: each timed call reads the next of enough weight
copies that together exceed twice the L2 (gemm_sweep.weight_copies). Ours is checked against a
float64 product of its dequantized weight on a few rows before it is timed. GB/s and % of copy
count the int4 weight bytes plus the scales (and zeros) over our time. Writes
benchmarks/results/int4/<device>.json with a verdict per bar of the int4 issue (`BARS`).
Without a GPU of compute capability 8.0 or newer, it prints why and exits 0.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

KERNEL_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(KERNEL_DIR.parent / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_sweep import weight_copies  # noqa: E402

import benchlib  # noqa: E402

START = time.perf_counter()
BUDGET_S = {"full": 240.0, "quick": 90.0}
REP_MS = 10
GROUP = 128
SHAPES = [  # (model, layer, K, N)
    ("llama3-8b", "qkv", 4096, 6144),
    ("llama3-8b", "gate_up", 4096, 28672),
    ("llama3-8b", "down", 14336, 4096),
    ("llama3-8b", "o", 4096, 4096),
    ("square", "square", 8192, 8192),
]
TOKENS = [1, 4, 16, 32, 64, 128, 256]
QUICK_TOKENS = [1, 16, 64, 128]
BASELINES = ("bf16", "fp8_w8a8", "int8_w8a8")


@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    model: str
    layer: str
    m: int
    k: int
    n: int


def cases(quick: bool) -> list[Case]:
    tokens = QUICK_TOKENS if quick else TOKENS
    return [Case("w4a16", model, layer, m, k, n) for model, layer, k, n in SHAPES for m in tokens]


def weight_bytes(case: Case, zeros: bool) -> int:
    """Bytes a call must read of the weight: 4 bits a weight, a 2-byte scale (and zero) a group."""
    groups = case.k // GROUP * case.n
    return case.k * case.n // 2 + 2 * groups * (2 if zeros else 1)


# ---- bars of the int4 issue ----

# (label, layers or None for every layer, tokens, key, minimum)
BARS = [
    ("M <= 16: >= 3.0x bf16 F.linear", ("gate_up", "down"), (1, 4, 16), "speedup_vs_bf16", 3.0),
    (
        "M <= 16: >= 80% of copy on the weight bytes",
        ("gate_up", "down"),
        (1, 4, 16),
        "copy_fraction",
        0.8,
    ),
    ("M = 64: >= 1.5x bf16", None, (64,), "speedup_vs_bf16", 1.5),
    ("M = 128: >= 1.0x bf16", None, (128,), "speedup_vs_bf16", 1.0),
]


def bar_verdicts(results: list[dict]) -> list[dict]:
    """Per bar: the rows it covers, the worst value and PASS / FAIL (no row: NOT RUN)."""
    verdicts = []
    for label, layers, tokens, key, minimum in BARS:
        rows = [
            r
            for r in results
            if r["m"] in tokens and (layers is None or r["layer"] in layers) and r.get(key)
        ]
        worst = min((r[key] for r in rows), default=None)
        status = "NOT RUN" if worst is None else ("PASS" if worst >= minimum else "FAIL")
        verdicts.append({"bar": label, "worst": worst, "rows": len(rows), "verdict": status})
    return verdicts


# ---- contenders ----


def contenders(kernel, case: Case, a: torch.Tensor, l2_bytes) -> tuple[dict, dict]:
    """{name: (call taking one weight copy, [copies])} and the int4 operands of ours (for the
    check)."""
    g = torch.Generator(device="cuda").manual_seed(case.k * 7 + case.n)
    groups = case.k // GROUP

    def int4_copy():
        codes = torch.randint(
            0, 16, (case.k, case.n), dtype=torch.uint8, device="cuda", generator=g
        )
        return kernel.int4_pack(codes)

    scales = (torch.rand((groups, case.n), device="cuda", generator=g) * 0.01 + 1e-3).bfloat16()
    zeros = torch.randint(0, 16, (groups, case.n), device="cuda", generator=g).bfloat16()
    n4 = weight_copies(weight_bytes(case, False), l2_bytes)
    packed = [int4_copy() for _ in range(n4)]
    calls = {
        "ours": (lambda w: kernel.w4a16_gemm(a, w, scales), packed),
        "ours_awq": (lambda w: kernel.w4a16_gemm(a, w, scales, zeros), packed),
    }
    bf16 = [
        torch.randn((case.n, case.k), device="cuda", generator=g).bfloat16()
        for _ in range(weight_copies(2 * case.k * case.n, l2_bytes))
    ]
    calls["bf16"] = (lambda w: F.linear(a, w), bf16)
    eight = weight_copies(case.k * case.n, l2_bytes)
    sa = torch.rand((case.m, 1), device="cuda", generator=g) + 0.5
    sb = torch.rand((case.n, 1), device="cuda", generator=g) + 0.5
    if torch.cuda.get_device_capability() >= (8, 9):
        a8 = a.float().clamp(-448, 448).to(torch.float8_e4m3fn)
        w8 = [
            torch.randn((case.n, case.k), device="cuda", generator=g).to(torch.float8_e4m3fn)
            for _ in range(eight)
        ]
        calls["fp8_w8a8"] = (
            lambda w: kernel.cutlass_scaled_mm(a8, w.t(), sa, sb, torch.bfloat16),
            w8,
        )
    ai = a.float().round().clamp(-128, 127).to(torch.int8)
    wi = [
        torch.randint(-128, 128, (case.n, case.k), dtype=torch.int8, device="cuda", generator=g)
        for _ in range(eight)
    ]
    calls["int8_w8a8"] = (lambda w: kernel.cutlass_scaled_mm(ai, w.t(), sa, sb, torch.bfloat16), wi)
    return calls, {"packed": packed[0], "scales": scales, "zeros": zeros}


def verify(kernel, case: Case, a, ops: dict) -> None:
    """Ours (both formats) on up to 4 rows against float64 a @ w, w = (q - z) * s (exact)."""
    codes = kernel.int4_unpack(ops["packed"]).double()
    s = ops["scales"].double().repeat_interleave(GROUP, 0)
    rows = a[: min(4, case.m)]
    for name, z in (("ours", 8.0), ("ours_awq", ops["zeros"].double().repeat_interleave(GROUP, 0))):
        w = (codes - z) * s
        want = rows.double() @ w
        zeros = None if name == "ours" else ops["zeros"]
        got = kernel.w4a16_gemm(rows, ops["packed"], ops["scales"], zeros)
        benchlib.check_close(f"{name} {case}", got, want, ulps=1, rms_ulps=1)


def rotated_time_us(call, copies: list) -> float:
    def every_copy():
        for w in copies:
            call(w)

    return benchlib.gpu_time_us(every_copy, rep_ms=REP_MS) / len(copies)


def run_case(kernel, case: Case, l2_bytes) -> dict:
    g = torch.Generator(device="cuda").manual_seed(case.m)
    a = torch.randn((case.m, case.k), device="cuda", generator=g).bfloat16()
    calls, ops = contenders(kernel, case, a, l2_bytes)
    verify(kernel, case, a, ops)
    us = {name: rotated_time_us(call, copies) for name, (call, copies) in calls.items()}
    row = {**dataclasses.asdict(case), "us": us}
    row["gbs"] = {
        "ours": weight_bytes(case, False) / us["ours"] / 1e3,
        "ours_awq": weight_bytes(case, True) / us["ours_awq"] / 1e3,
    }
    for name in BASELINES:
        if name in us:
            row[f"speedup_vs_{name}"] = us[name] / us["ours"]
    return row


def summary(r: dict) -> str:
    ratios = " ".join(
        f"{name} x{r[f'speedup_vs_{name}']:.2f}" for name in BASELINES if f"speedup_vs_{name}" in r
    )
    return (
        f"{r['layer']:8s} K{r['k']:5d} N{r['n']:5d} M{r['m']:4d}: ours {r['us']['ours']:8.2f} us "
        f"({100 * r['copy_fraction']:4.1f}% of copy), awq {r['us']['ours_awq']:8.2f} us; {ratios}"
    )


NOTES = {
    "method": "GPU time = median of CUDA-graph replays, each running the contender once on every "
    "weight copy in turn (copies exceed twice the L2), divided by the copies; % of copy = int4 "
    "weight bytes plus 2-byte scales (and zeros) per group of 128 over our time, against a 1 GiB "
    "device-to-device copy",
    "contenders": {
        "ours": "w4a16_gemm, symmetric int4 (GPTQ uint4b8), groups of 128, bf16 activations",
        "ours_awq": "w4a16_gemm with zero points (AWQ), groups of 128",
        "bf16": "F.linear(a, w) on a bf16 weight (cuBLAS)",
        "fp8_w8a8": "our cutlass_scaled_mm, fp8 activations (pre-quantized) x fp8 weight, scales "
        "per token x per channel",
        "int8_w8a8": "our cutlass_scaled_mm, int8 x int8, per token x per channel",
    },
}


def main() -> int:
    args = benchlib.sweep_arguments(
        __doc__.splitlines()[0], "each shape at M 1, 16, 64, 128", BUDGET_S
    ).parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0):
        print("int4_sweep: skipped, it times CUDA kernels of capability 8.0 or newer")
        return 0
    path, payload = benchlib.run_budgeted_sweep(
        kernel_name="quant",
        kernel_dir=KERNEL_DIR,
        start=START,
        args=args,
        budget_s=BUDGET_S,
        cases=cases(args.quick),
        run_case=run_case,
        summary=summary,
        sort_key=lambda r: (r["layer"], r["k"], r["n"], r["m"]),
        notes=NOTES,
        results_subdir="int4",
    )
    payload["bars"] = bar_verdicts(payload["results"])
    benchlib.save(path, payload)
    for v in payload["bars"]:
        worst = "-" if v["worst"] is None else f"{v['worst']:.2f}"
        print(f"{v['verdict']:8s} {v['bar']} (worst {worst} over {v['rows']} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
