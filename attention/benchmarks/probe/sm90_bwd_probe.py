"""The Hopper attention backward alone (kernel_src/attention_sm90_bwd.cuh), built in under a
minute with torch's extension loader instead of the whole kit: gradients against float64 autograd
of the formula, each error against twice torch's own bf16 autograd error plus a floor (the bound
of tests/test_attention_bwd_ops.py), then backward times at B*S = 16K tokens, H = 32/8, D = 64, 128,
256 (PROBE_DIMS=256,128 picks) next to SDPA flash and cuDNN. Writes $OUT/sm90_bwd_probe.json (or
/tmp).

    python attention/benchmarks/probe/sm90_bwd_probe.py      (on an sm_90 GPU with CUDA torch)

Experiments: PROBE_KERNEL_SRC=<dir> builds a variant from a copy of kernel_src (the extension is
named after the folder), PROBE_BUILD_ONLY=1 stops after the build (so that variants build in
parallel and time one after the other from torch's extension cache), PROBE_TIMING_ONLY=1 skips
the gradient checks, PROBE_PROFILE=1 prints each kernel's time (torch profiler).
"""

import importlib.util
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from probe_common import ROOT, bench, formula, sdpa_backward_ms, within_bound
from torch.utils.cpp_extension import load

CUTLASS = os.path.join(
    list(importlib.util.find_spec("cutlass_library").submodule_search_locations)[0],
    "source",
    "include",
)
SRC = os.path.abspath(
    os.environ.get("PROBE_KERNEL_SRC", os.path.join(ROOT, "attention/kernel_src"))
)
VARIANT = "" if "PROBE_KERNEL_SRC" not in os.environ else "_" + os.path.basename(SRC)
os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"
t0 = time.time()
ext = load(
    "attn_sm90_bwd_probe" + VARIANT,
    [
        os.path.join(os.path.dirname(__file__), "sm90_bwd_probe_binding.cpp"),
        os.path.join(SRC, "attention_sm90_bwd.cu"),
    ],
    extra_include_paths=[SRC, CUTLASS],
    extra_cuda_cflags=["-O3", "-std=c++17", "-DNDEBUG", "--expt-relaxed-constexpr"],
    verbose=False,
)
print(f"built{VARIANT} in {time.time() - t0:.0f} s", flush=True)
if os.environ.get("PROBE_BUILD_ONLY"):
    sys.exit(0)


CASES = [  # B, Sq, Sk, H, Hk, causal
    (2, 64, 64, 2, 2, False),
    (2, 128, 128, 4, 2, True),
    (2, 130, 200, 4, 1, False),
    (2, 200, 90, 2, 2, True),
    (1, 300, 300, 4, 2, True),
    (2, 1, 77, 2, 1, False),
    (1, 517, 389, 8, 2, True),
    (1, 389, 517, 8, 2, True),
]
dev = "cuda"
DIMS = [int(d) for d in os.environ.get("PROBE_DIMS", "64,128,256").split(",")]
results = []
CHECKS = [(dt, D, case) for dt in (torch.bfloat16, torch.float16) for D in DIMS for case in CASES]
for dt, D, case in [] if os.environ.get("PROBE_TIMING_ONLY") else CHECKS:
    B, sq, sk, h, hk, causal = case
    g = torch.Generator(device="cpu").manual_seed(sq + sk)
    q, k, v = (
        torch.randn(s, generator=g).to(dev) for s in [(B, sq, h, D), (B, sk, hk, D), (B, sk, hk, D)]
    )
    dout = torch.randn(B, sq, h, D, generator=g).to(dev)
    leaves64 = [t.double().requires_grad_() for t in (q, k, v)]
    out64, lse64 = formula(*leaves64, D**-0.5, causal)
    out64.backward(dout.double())
    leaves16 = [t.to(dt).requires_grad_() for t in (q, k, v)]
    out16, _ = formula(*leaves16, D**-0.5, causal)
    out16.backward(dout.to(dt))
    qb, kb, vb = (t.to(dt).contiguous() for t in (q, k, v))
    grads = [torch.full_like(t, float("nan")) for t in (qb, kb, vb)]
    ran = ext.bwd(
        qb,
        kb,
        vb,
        out64.detach().to(dt).contiguous(),
        lse64.detach().float().contiguous(),
        dout.to(dt).contiguous(),
        *grads,
        D**-0.5,
        causal,
    )
    torch.cuda.synchronize()
    row = {"dtype": str(dt), "D": D, "case": str(case), "ran": ran}
    ok = ran
    for name, got, l64, l16 in zip(("dq", "dk", "dv"), grads, leaves64, leaves16):
        err, terr, within = within_bound(got, l64.grad, l16.grad)
        row[name] = (err, terr)
        ok &= within
    row["ok"] = bool(ok)
    results.append(row)
    print(row, flush=True)


timing = []
dt = torch.bfloat16
for D, S, causal in [(d, s, c) for d in DIMS for s in (512, 2048, 8192) for c in (True, False)]:
    B, H, HK = 16384 // S, 32, 8
    q = torch.randn(B, S, H, D, device=dev, dtype=dt)
    k = torch.randn(B, S, HK, D, device=dev, dtype=dt)
    v = torch.randn(B, S, HK, D, device=dev, dtype=dt)
    dout = torch.randn_like(q)
    qs, ks, vs = (t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=True)
    out_b = out.detach().transpose(1, 2).contiguous()
    lse = torch.zeros(B, H, S, device=dev)  # values do not matter for timing
    grads = [torch.empty_like(t) for t in (q, k, v)]
    ours = bench(lambda: ext.bwd(q, k, v, out_b, lse, dout, *grads, D**-0.5, causal))
    res = sdpa_backward_ms(qs, ks, vs, dout, causal)
    if os.environ.get("PROBE_PROFILE"):  # each kernel's share of one call
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                ext.bwd(q, k, v, out_b, lse, dout, *grads, D**-0.5, causal)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=6), flush=True)
    flops = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)
    row = {"D": D, "S": S, "causal": causal, **res, "ours_ms": ours}
    row["ours_tflops"] = flops / ours / 1e9
    row["variant"] = VARIANT
    if isinstance(res["cudnn"], float):
        row["vs_cudnn"] = res["cudnn"] / ours
    timing.append(row)
    print(row, flush=True)
json.dump(
    {"correct": results, "timing": timing},
    open(os.path.join(os.environ.get("OUT", "/tmp"), f"sm90_bwd_probe{VARIANT}.json"), "w"),
    indent=1,
)
