"""Sweep of the quantize ops against PyTorch eager and torch.compile, in the same run (CUDA).

    python quant/benchmarks/sweep.py [--quick] [--dtype bfloat16] [--out PATH]

Loads the *built* kernel (quant/build, via kernels.get_local_kernel), checks each op bit for bit
against the eager PyTorch code before timing it, then times ours, eager and torch.compile of the
eager code with CUDA-graph replay (scripts/benchlib.py). Modes: fp8 static, dynamic per tensor,
dynamic per token, per group of 128; int8 static, dynamic symmetric and asymmetric. Sizes: token
counts 1 … 16384 × hidden 4096 and 8192 (Llama-3-8B / 70B). Bytes per call: the input read
once, the quantized output and the scales written once. On a machine without a GPU the sweep
prints why and exits 0. Writes benchmarks/results/<device>.json with device, versions, commit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

KERNEL_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(KERNEL_DIR.parent / "scripts"))
import benchlib  # noqa: E402

FP8_MAX = 448.0
FP8_MIN_SCALE = 1.0 / (448.0 * 512.0)


# ---- the eager code users write (vLLM's native fallbacks, in fp32); compile gets the same ----


def _fp8(v):
    return v.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def fp8_static(x, scale):
    return _fp8(x.float() * (1.0 / scale)), scale


def fp8_per_tensor(x):
    scale = (x.float().abs().amax() / FP8_MAX).clamp(min=FP8_MIN_SCALE).reshape(1)
    return _fp8(x.float() * (1.0 / scale)), scale


def fp8_per_token(x):
    xf = x.float()
    scale = (xf.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=FP8_MIN_SCALE)
    return _fp8(xf / scale), scale


def fp8_group128(x):
    xg = x.float().unflatten(-1, (-1, 128))
    scale = xg.abs().amax(dim=-1, keepdim=True).clamp(min=1e-10) / FP8_MAX
    return _fp8(xg / scale).flatten(-2), scale.squeeze(-1)


def int8_static(x, scale):
    return torch.round(x.float() / scale).clamp(-128, 127).to(torch.int8), scale


def int8_sym(x):
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    mul = torch.where(amax == 0, torch.zeros_like(amax), torch.full_like(amax, 127.0) / amax)
    return torch.round(xf * mul).clamp(-128, 127).to(torch.int8), amax / 127.0


def int8_asym(x):
    # vLLM's rule; the sweep's random rows are never constant, so no corner case is needed here.
    xf = x.float()
    mn, mx = xf.amin(dim=-1, keepdim=True), xf.amax(dim=-1, keepdim=True)
    scale = (mx - mn) / 255.0
    azp = torch.round(-128.0 - mn / scale)
    q = (torch.round(xf / scale) + azp).clamp(-128, 127).to(torch.int8)
    return q, scale, azp.to(torch.int32)


def _ours(kernel, mode, scale):
    return {
        "fp8_static": lambda x: kernel.scaled_fp8_quant(x, scale),
        "fp8_per_tensor": lambda x: kernel.scaled_fp8_quant(x),
        "fp8_per_token": lambda x: kernel.scaled_fp8_quant(x, use_per_token_if_dynamic=True),
        "fp8_group128": lambda x: kernel.per_token_group_quant_fp8(x, 128),
        "int8_static": lambda x: kernel.scaled_int8_quant(x, scale),
        "int8_sym": lambda x: kernel.scaled_int8_quant(x),
        "int8_asym": lambda x: kernel.scaled_int8_quant(x, symmetric=False),
    }[mode]


def _eager(mode, scale):
    return {
        "fp8_static": lambda x: fp8_static(x, scale),
        "fp8_per_tensor": fp8_per_tensor,
        "fp8_per_token": fp8_per_token,
        "fp8_group128": fp8_group128,
        "int8_static": lambda x: int8_static(x, scale),
        "int8_sym": int8_sym,
        "int8_asym": int8_asym,
    }[mode]


MODES = [
    "fp8_per_token",
    "fp8_group128",
    "fp8_per_tensor",
    "fp8_static",
    "int8_sym",
    "int8_asym",
    "int8_static",
]
TOKENS = [1, 16, 128, 1024, 4096, 16384]
HIDDEN = [4096, 8192]


def cases(quick: bool):
    for mode in MODES:
        for hidden in [4096] if quick else HIDDEN:
            for tokens in [1, 128, 4096] if quick else TOKENS:
                yield mode, tokens, hidden


def _bits(t):
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def run_case(kernel, mode, tokens, hidden, dtype, compiled_cache):
    x = torch.randn(tokens, hidden, dtype=dtype, device="cuda")
    scale = torch.tensor([0.05], device="cuda")
    ours, eager = _ours(kernel, mode, scale), _eager(mode, scale)
    got, want = ours(x), eager(x)
    for g, w in zip(got, want):
        if g is not None and not torch.equal(_bits(g.reshape(w.shape)), _bits(w)):
            raise SystemExit(f"verification failed for {mode} tokens={tokens} hidden={hidden}")
    if mode not in compiled_cache:
        compiled_cache[mode] = torch.compile(eager, dynamic=False)
    compiled = compiled_cache[mode]
    nbytes = x.numel() * x.element_size() + sum(
        t.numel() * t.element_size() for t in got if t is not None
    )
    times = {
        "ours": benchlib.gpu_time_us(lambda: ours(x)),
        "eager": benchlib.gpu_time_us(lambda: eager(x)),
        "compile": benchlib.gpu_time_us(lambda: compiled(x)),
    }
    return {
        "op": mode,
        "dtype": str(dtype).replace("torch.", ""),
        "tokens": tokens,
        "hidden": hidden,
        "bytes": nbytes,
        "us": times,
        "gbs": {k: nbytes / (v * 1e-6) / 1e9 for k, v in times.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--out", type=Path, help="result file (default results/<device>.json)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("sweep: skipped, the quantize sweep times CUDA kernels and no GPU is available")
        return 0
    if torch.cuda.get_device_capability() < (8, 9):
        print("sweep: skipped, fp8 needs a GPU of compute capability 8.9 or newer")
        return 0
    kernel = benchlib.load_built_kernel(KERNEL_DIR)
    torch._dynamo.config.cache_size_limit = 256
    dtype = getattr(torch, args.dtype)
    env = benchlib.environment(kernel)
    copy_gbs = benchlib.copy_bandwidth_gbs()
    print(f"{env['device']}: copy ceiling {copy_gbs:.0f} GB/s", flush=True)
    results, compiled_cache = [], {}
    for mode, tokens, hidden in cases(args.quick):
        r = run_case(kernel, mode, tokens, hidden, dtype, compiled_cache)
        r["copy_fraction"] = r["gbs"]["ours"] / copy_gbs
        r["speedup_vs_compile"] = r["us"]["compile"] / r["us"]["ours"]
        r["speedup_vs_eager"] = r["us"]["eager"] / r["us"]["ours"]
        results.append(r)
        print(
            f"{mode:15s} T={tokens:6d} h={hidden:5d}  ours {r['us']['ours']:8.2f} us "
            f"{r['gbs']['ours']:6.0f} GB/s ({100 * r['copy_fraction']:5.1f}% copy)  "
            f"compile {r['us']['compile']:8.2f} us (x{r['speedup_vs_compile']:.2f})  "
            f"eager {r['us']['eager']:8.2f} us (x{r['speedup_vs_eager']:.2f})",
            flush=True,
        )
    copy_gbs = benchlib.final_copy_ceiling(results, copy_gbs)
    payload = {
        "kernel": "quant",
        "environment": env,
        "method": "GPU time = median of CUDA-graph replay (triton do_bench_cudagraph) of the "
        "public function (allocations included, for every contender); bytes = input read once "
        "+ quantized output and scales written once; copy ceiling = 1 GiB device-to-device copy, "
        "best of before and after the sweep; ours verified bit for bit against eager first",
        "copy_gbs": copy_gbs,
        "results": results,
    }
    path = benchlib.result_path(args.out, KERNEL_DIR, env)
    benchlib.save(path, payload)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
