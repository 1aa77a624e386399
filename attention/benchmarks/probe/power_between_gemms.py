"""The attention forward at one Qwen3-8B prefill shape (8 x 2048 tokens, 32 / 8 heads, D128,
causal, bf16), ours against SDPA's cuDNN backend, alone and between GEMMs of the model's MLP size
(3 of [16K, 4096] x [4096, 24576] on each side), with nvidia-smi sampling the SM clock and the
power draw every 20 ms over 3 s of calls. In a model the GEMMs hold the GPU at its power limit, so
the clock the attention runs at is theirs; this shows whether a kernel's lead alone survives it.

    python attention/benchmarks/probe/power_between_gemms.py   (a built kit: scripts/build.py)

Writes $OUT/power_between_gemms.txt (or /tmp).
"""

import os
import statistics
import subprocess
import time
from pathlib import Path

import kernels
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[3]
SECONDS = 3.0


def sampled(fn, secs=SECONDS):
    """(fn(secs)'s figure, SM clocks in MHz, power draws in W) while fn runs."""
    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
         "-lms", "20"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    figure = fn(secs)
    smi.terminate()
    rows = [line.split(",") for line in smi.communicate()[0].splitlines() if line.count(",") == 1]
    return figure, [float(c) for c, _ in rows], [float(p) for _, p in rows]


def alone(fn):
    """us a call of fn, 20 back-to-back calls per timing, median over secs."""

    def run(secs):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        times, end = [], time.time() + secs
        while time.time() < end:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(20):
                fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1000 / 20)
        return statistics.median(times)

    return run


def between(fn, gemm, gemms=3):
    """us of one call of fn timed between `gemms` GEMMs on each side, median over secs."""

    def run(secs):
        for _ in range(3):
            fn()
            gemm()
        torch.cuda.synchronize()
        times, end = [], time.time() + secs
        while time.time() < end:
            for _ in range(gemms):
                gemm()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            for _ in range(gemms):
                gemm()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1000)
        return statistics.median(times)

    return run


def main():
    kit = kernels.get_local_kernel(ROOT / "attention" / "build", backend="cuda")
    log = open(os.path.join(os.environ.get("OUT", "/tmp"), "power_between_gemms.txt"), "w")
    b, s = 8, 2048
    q = torch.randn(b, s, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, s, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, s, 8, 128, device="cuda", dtype=torch.bfloat16)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    x = torch.randn(b * s, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(24576, 4096, device="cuda", dtype=torch.bfloat16) * 0.02

    def ours():
        return kit.flash_attn_func(q, k, v, causal=True)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)

    def gemm():
        return x @ w.t()

    runs = []
    for name, fn in (("ours", ours), ("cudnn", cudnn)):
        runs += [(f"{name} alone", alone(fn)), (f"{name} between GEMMs", between(fn, gemm))]
    runs.append(("GEMM alone", alone(gemm)))
    runs += [
        (f"{name} alone (again)", alone(fn)) for name, fn in (("ours", ours), ("cudnn", cudnn))
    ]
    for what, run in runs:
        us, clocks, power = sampled(run)
        line = (
            f"{what}: {us:.1f} us a call; SM clock median {statistics.median(clocks):.0f} MHz "
            f"(min {min(clocks):.0f}), power median {statistics.median(power):.0f} W "
            f"(max {max(power):.0f})"
        )
        print(line, flush=True)
        print(line, file=log, flush=True)


if __name__ == "__main__":
    main()
