"""Sweep of the activation ops against PyTorch eager and torch.compile, in the same run (CUDA).

    python activation/benchmarks/sweep.py [--quick] [--out PATH]

Loads the *built* kernel (activation/build, via kernels.get_local_kernel), checks each op
against the fp32 reference before timing it, then times ours, eager and torch.compile of the
eager code with CUDA-graph replay (scripts/benchlib.py). Sizes: decode and prefill token counts
(1 … 32768) × the gated widths of Llama-2-7B (2×11008), Llama-3-8B (2×14336) and 2×4096.
Bytes per call: gated ops read tokens×2d and write tokens×d elements; unary ops read and write
tokens×n. Writes benchmarks/results/<device>.json with device, versions and commit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

KERNEL_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(KERNEL_DIR.parent / "scripts"))
import benchlib  # noqa: E402


def _act_and_mul(act):
    """act(x[..., :d]) * x[..., d:], as users write it."""

    def eager(x):
        d = x.shape[-1] // 2
        return act(x[..., :d]) * x[..., d:]

    return eager


def _mul_and_act(act):
    """x[..., :d] * act(x[..., d:])."""

    def eager(x):
        d = x.shape[-1] // 2
        return x[..., :d] * act(x[..., d:])

    return eager


def _swigluoai(x, alpha=1.702, limit=7.0):
    """gpt-oss: interleaved gate/up, as vLLM's native SwigluOAIAndMul writes it."""
    gate = x[..., ::2].clamp(max=limit)
    up = x[..., 1::2].clamp(-limit, limit)
    return (up + 1) * gate * torch.sigmoid(alpha * gate)


# The eager code users write today (in the activation dtype); torch.compile gets the same code.
GATED_EAGER = {
    "silu_and_mul": _act_and_mul(F.silu),
    "mul_and_silu": _mul_and_act(F.silu),
    "gelu_and_mul": _act_and_mul(F.gelu),
    "gelu_tanh_and_mul": _act_and_mul(lambda a: F.gelu(a, approximate="tanh")),
    "fatrelu_and_mul": _act_and_mul(lambda a: F.threshold(a, 0.0, 0.0)),
    "swigluoai_and_mul": _swigluoai,
}
UNARY_EAGER = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: (
        0.5 * x * (1.0 + torch.tanh(0.7978845608 * x * (1.0 + 0.044715 * x * x)))
    ),
    "gelu_new": lambda x: 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x**3))),
    "gelu_quick": lambda x: x * torch.sigmoid(1.702 * x),
}

TOKENS = [1, 4, 16, 64, 128, 512, 2048, 8192, 32768]
GATED_WIDTHS = {"llama3-8b": 14336, "llama2-7b": 11008, "4096": 4096}


def cases(quick: bool):
    """(op, tokens, width) with width = the output width d (gated) or n (unary)."""
    headline = ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"]
    tokens = [1, 128, 8192] if quick else TOKENS
    for op in headline:
        for t in tokens:
            yield op, t, GATED_WIDTHS["llama3-8b"]
        for width in (GATED_WIDTHS["llama2-7b"], GATED_WIDTHS["4096"]):
            for t in [8192] if quick else [1, 128, 8192, 32768]:
                yield op, t, width
    for op in ("mul_and_silu", "fatrelu_and_mul", "swigluoai_and_mul"):
        for t in (1, 8192):
            yield op, t, GATED_WIDTHS["llama3-8b"]
    for op in UNARY_EAGER:
        for t in (1, 128, 8192):  # 8192 × 14336 bf16 = 235 MB in, 235 MB out
            yield op, t, 14336


def run_case(kernel, op, tokens, width, dtype, compiled_cache, enable_pdl=None):
    gated = op in GATED_EAGER
    eager = GATED_EAGER[op] if gated else UNARY_EAGER[op]
    x = torch.randn(tokens, 2 * width if gated else width, dtype=dtype, device="cuda")
    out = torch.empty(tokens, width, dtype=dtype, device="cuda")
    fn = getattr(kernel, op)

    def ours(out, x):
        return fn(out, x, enable_pdl=enable_pdl)

    # Verify before timing: our output against the fp32 reference rounded once.
    ours(out, x)
    reference = eager(x.float()).to(dtype)
    if not torch.allclose(out.float(), reference.float(), rtol=2**-7, atol=1e-3):
        err = (out.float() - reference.float()).abs().max().item()
        raise SystemExit(
            f"verification failed for {op} tokens={tokens} width={width}: max err {err}"
        )

    if op not in compiled_cache:
        compiled_cache[op] = torch.compile(eager, dynamic=False)
    compiled = compiled_cache[op]
    element = x.element_size()
    nbytes = (x.numel() + out.numel()) * element
    times = {
        "ours": benchlib.gpu_time_us(lambda: ours(out, x)),
        "eager": benchlib.gpu_time_us(lambda: eager(x)),
        "compile": benchlib.gpu_time_us(lambda: compiled(x)),
    }
    result = {
        "op": op,
        "dtype": str(dtype).replace("torch.", ""),
        "tokens": tokens,
        "width": width,
        "bytes": nbytes,
        "us": times,
        "gbs": {k: nbytes / (v * 1e-6) / 1e9 for k, v in times.items()},
    }
    if tokens <= 128:
        # Decode sizes: a call costs its launch more than its GPU time; report what an eager
        # caller sees too (Python + dispatcher + launch; torch.compile adds its guards).
        result["wall_us"] = {
            "ours": benchlib.wall_time_us(lambda: ours(out, x)),
            "compile": benchlib.wall_time_us(lambda: compiled(x)),
        }
        # With enable_pdl=True our kernels use programmatic dependent launch, and in the graph
        # above each call overlaps the previous call's tail. After a producer of x that does not
        # release its dependents (here a copy, as a GEMM would be) that overlap is gone: GPU time
        # of [producer, op] minus that of [producer] alone.
        x_src = x.clone()

        def produce():
            x.copy_(x_src)

        producer_us = benchlib.gpu_time_us(produce)
        result["us_after_producer"] = {
            "ours": benchlib.gpu_time_us(lambda: (produce(), ours(out, x))) - producer_us,
            "compile": benchlib.gpu_time_us(lambda: (produce(), compiled(x))) - producer_us,
        }
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer sizes")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument(
        "--out", type=Path, help="result file (default benchmarks/results/<device>.json)"
    )
    args = parser.parse_args()
    kernel = benchlib.load_built_kernel(KERNEL_DIR)
    torch._dynamo.config.cache_size_limit = 256
    dtype = getattr(torch, args.dtype)
    env = benchlib.environment(kernel)
    # ACTIVATION_PDL=1 / 0: the benchmark passes enable_pdl=True / False (unset: None, the default).
    enable_pdl = benchlib.pdl_from_env("ACTIVATION_PDL")
    env["activation_pdl"] = enable_pdl is True  # see activation_cuda.cu
    copy_gbs = benchlib.copy_bandwidth_gbs()
    print(f"{env['device']}: copy ceiling {copy_gbs:.0f} GB/s", flush=True)
    results, compiled_cache = [], {}
    for op, tokens, width in cases(args.quick):
        r = run_case(kernel, op, tokens, width, dtype, compiled_cache, enable_pdl)
        r["copy_fraction"] = r["gbs"]["ours"] / copy_gbs
        r["speedup_vs_compile"] = r["us"]["compile"] / r["us"]["ours"]
        r["speedup_vs_eager"] = r["us"]["eager"] / r["us"]["ours"]
        if "wall_us" in r:
            r["wall_speedup_vs_compile"] = r["wall_us"]["compile"] / r["wall_us"]["ours"]
            after = r["us_after_producer"]
            r["after_producer_speedup_vs_compile"] = after["compile"] / after["ours"]
        results.append(r)
        print(
            f"{op:18s} T={tokens:6d} w={width:6d}  ours {r['us']['ours']:9.2f} us "
            f"{r['gbs']['ours']:7.0f} GB/s ({100 * r['copy_fraction']:5.1f}% copy)  "
            f"compile {r['us']['compile']:9.2f} us (x{r['speedup_vs_compile']:.2f})  "
            f"eager {r['us']['eager']:9.2f} us (x{r['speedup_vs_eager']:.2f})"
            + (
                f"  per call: ours {r['wall_us']['ours']:.2f} us, compile {r['wall_us']['compile']:.2f} us"
                f" (x{r['wall_speedup_vs_compile']:.2f}); after a producer: ours "
                f"{r['us_after_producer']['ours']:.2f} us, compile {r['us_after_producer']['compile']:.2f} us"
                if "wall_us" in r
                else ""
            ),
            flush=True,
        )
    copy_gbs = benchlib.final_copy_ceiling(results, copy_gbs)
    payload = {
        "kernel": "activation",
        "environment": env,
        "method": "GPU time = median of CUDA-graph replay (triton do_bench_cudagraph); per-call "
        "time at <= 128 tokens = median of back-to-back launches (triton do_bench), launch overhead "
        "included; our kernels launch with programmatic dependent launch only when environment.activation_pdl "
        "(ACTIVATION_PDL=1: enable_pdl=True; it lets back-to-back calls in a graph overlap); us_after_producer (<= 128 tokens) is "
        "the GPU time of [copy producing x, op] minus that of the copy alone; bytes = inputs read once + outputs written once; copy ceiling = 1 GiB "
        "device-to-device copy after a clock warm-up, same run",
        "copy_gbs": copy_gbs,
        "results": results,
    }
    path = benchlib.result_path(args.out, KERNEL_DIR, env)
    benchlib.save(path, payload)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
