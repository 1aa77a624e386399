"""Sweep of the quantize ops against PyTorch eager and torch.compile, in the same run (CUDA).

    python quant/benchmarks/sweep.py [--quick] [--dtype bfloat16] [--out PATH]

Loads the *built* kernel (quant/build, via kernels.get_local_kernel), checks each op bit for bit
against the eager PyTorch code before timing it (and records whether torch.compile of that code
gives the same bits), then times ours, eager and torch.compile of the eager code with CUDA-graph
replay (scripts/benchlib.py). The eager code divides with the documented rounding on CPU and
CUDA alike (see `Divisors`). Modes: fp8 static, dynamic per tensor,
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
#
# Every division by a constant divides by a tensor `d.<name>` on the input's device, never by a
# Python number. On CUDA `t / 448.0` is `t * (1 / 448)` (PyTorch's CPU-scalar path of division),
# which rounds twice and put the per-token scales one ulp off ours; `127.0 / t` is
# `t.reciprocal() * 127` on every device. Inductor also turns a division by any constant it can
# see (a Python number or a `full_like`) into a multiplication by the reciprocal on CUDA, so the
# divisors are tensors that reach the compiled graph as inputs. A tensor divisor is one IEEE
# division, the documented rounding, in eager mode on CPU and CUDA and in Triton with
# `eager_numerics.division_rounding` (set in `exact_compiled_division`).


class Divisors:
    """The constant divisors of the eager code as 0-d float32 tensors on `device`."""

    def __init__(self, device):
        def full(v):
            return torch.full((), v, dtype=torch.float32, device=device)

        self.one, self.fp8_max, self.i8_max, self.u8_range = (
            full(1.0),
            full(FP8_MAX),
            full(127.0),
            full(255.0),
        )


def _fp8(v):
    return v.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def fp8_static(x, scale, d):
    return _fp8(x.float() * (d.one / scale)), scale


def fp8_per_tensor(x, d):
    scale = (x.float().abs().amax() / d.fp8_max).clamp(min=FP8_MIN_SCALE).reshape(1)
    return _fp8(x.float() * (d.one / scale)), scale


def fp8_per_token(x, d):
    xf = x.float()
    scale = (xf.abs().amax(dim=-1, keepdim=True) / d.fp8_max).clamp(min=FP8_MIN_SCALE)
    return _fp8(xf / scale), scale


def fp8_group128(x, d):
    xg = x.float().unflatten(-1, (-1, 128))
    scale = xg.abs().amax(dim=-1, keepdim=True).clamp(min=1e-10) / d.fp8_max
    return _fp8(xg / scale).flatten(-2), scale.squeeze(-1)


def int8_static(x, scale, d):
    return torch.round(x.float() / scale).clamp(-128, 127).to(torch.int8), scale


def int8_sym(x, d):
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    mul = torch.where(amax == 0, torch.zeros_like(amax), d.i8_max / amax)
    return torch.round(xf * mul).clamp(-128, 127).to(torch.int8), amax / d.i8_max


def int8_asym(x, d):
    # vLLM's rule; the sweep's random rows are never constant, so no corner case is needed here.
    xf = x.float()
    mn, mx = xf.amin(dim=-1, keepdim=True), xf.amax(dim=-1, keepdim=True)
    scale = (mx - mn) / d.u8_range
    azp = torch.round(-128.0 - mn / scale)
    q = (torch.round(xf / scale) + azp).clamp(-128, 127).to(torch.int8)
    return q, scale, azp.to(torch.int32)


def exact_compiled_division() -> bool:
    """Makes Inductor's Triton code divide with div_rn (IEEE, as eager) instead of its default
    approximate `div.full.f32`; False where this torch has no such switch."""
    numerics = getattr(torch._inductor.config, "eager_numerics", None)
    if numerics is None or not hasattr(numerics, "division_rounding"):
        return False
    numerics.division_rounding = True
    return True


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
    d = Divisors(scale.device)
    return {
        "fp8_static": lambda x: fp8_static(x, scale, d),
        "fp8_per_tensor": lambda x: fp8_per_tensor(x, d),
        "fp8_per_token": lambda x: fp8_per_token(x, d),
        "fp8_group128": lambda x: fp8_group128(x, d),
        "int8_static": lambda x: int8_static(x, scale, d),
        "int8_sym": lambda x: int8_sym(x, d),
        "int8_asym": lambda x: int8_asym(x, d),
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


def same_bits(got, want) -> bool:
    """Every output of `got` (ours: None for an absent zero point) equals `want` bit for bit."""
    return all(
        g is None or torch.equal(_bits(g.reshape(w.shape)), _bits(w)) for g, w in zip(got, want)
    )


def run_case(kernel, mode, tokens, hidden, dtype, compiled_cache):
    x = torch.randn(tokens, hidden, dtype=dtype, device="cuda")
    scale = torch.tensor([0.05], device="cuda")
    ours, eager = _ours(kernel, mode, scale), _eager(mode, scale)
    got, want = ours(x), eager(x)
    if not same_bits(got, want):
        raise SystemExit(f"verification failed for {mode} tokens={tokens} hidden={hidden}")
    if mode not in compiled_cache:
        compiled_cache[mode] = torch.compile(eager, dynamic=False)
    compiled = compiled_cache[mode]
    # Not fatal: a torch whose Triton code still divides approximately is timed all the same,
    # and the result says so.
    compile_bitwise = same_bits(compiled(x), want)
    if not compile_bitwise:
        print(f"note: torch.compile differs from eager for {mode} tokens={tokens}", flush=True)
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
        "compile_bitwise": compile_bitwise,
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
    exact_division = exact_compiled_division()
    dtype = getattr(torch, args.dtype)
    env = benchlib.environment(kernel)
    copy_gbs = benchlib.copy_bandwidth_gbs()
    print(
        f"{env['device']}: copy ceiling {copy_gbs:.0f} GB/s; torch.compile divides "
        f"{'exactly (div_rn)' if exact_division else 'approximately (no division_rounding)'}",
        flush=True,
    )
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
        "best of before and after the sweep; ours verified bit for bit against eager first, "
        "torch.compile compared bit for bit (compile_bitwise), its Triton division IEEE "
        "(eager_numerics.division_rounding) where the torch has the switch",
        "compile_exact_division": exact_division,
        "copy_gbs": copy_gbs,
        "results": results,
    }
    path = benchlib.result_path(args.out, KERNEL_DIR, env)
    benchlib.save(path, payload)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
