"""What attention sinks (s_aux) cost on top of the same call without them, on gpt-oss's attention
shape (64 query / 8 KV heads, head dim 64, bf16): flash_attn_func prefill and
flash_attn_with_kvcache decode, each timed by triton's do_bench_cudagraph (CUDA-graph replay of
back-to-back calls) in one process. Prints one line per call and a JSON summary.

    python attention/benchmarks/probe/sinks_cost.py   # after scripts/build.py attention
"""

import json
from pathlib import Path

import kernels
import torch
from triton.testing import do_bench_cudagraph

BUILD = Path(__file__).resolve().parents[2] / "build"


def us(fn):
    fn()
    torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=200) * 1000


def main():
    k = kernels.get_local_kernel(BUILD, backend="cuda")
    torch.manual_seed(0)
    new = dict(device="cuda", dtype=torch.bfloat16)
    sinks = torch.randn(64, **new)
    rows = []
    for b, s, causal in ((8, 2048, True), (8, 2048, False), (1, 16384, True)):
        q, kv = torch.randn(b, s, 64, 64, **new), torch.randn(b, s, 8, 64, **new)
        calls = [
            lambda x=x: k.flash_attn_func(q, kv, kv, causal=causal, s_aux=x) for x in (None, sinks)
        ]
        rows.append((f"prefill B{b} S{s} H64/8 D64 causal={causal}", *map(us, calls)))
    for b, length in ((1, 4096), (64, 4096), (8, 32768)):
        q, cache = torch.randn(b, 1, 64, 64, **new), torch.randn(b, length, 8, 64, **new)
        lens = torch.full((b,), length, dtype=torch.int32, device="cuda")
        calls = [
            lambda x=x: k.flash_attn_with_kvcache(
                q, cache, cache, cache_seqlens=lens, causal=True, s_aux=x
            )
            for x in (None, sinks)
        ]
        rows.append((f"decode B{b} KV{length} H64/8 D64", *map(us, calls)))
    for name, plain, with_sinks in rows:
        print(f"{name}: {plain:.1f} us, with s_aux {with_sinks:.1f} us ({with_sinks / plain:.3f}x)")
    print(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows)))


if __name__ == "__main__":
    main()
