"""The CUDA attention backward kernels alone, built in seconds with torch's extension loader
instead of the whole kit (a GPU session's first look at a kernel change): gradients against
float64 autograd of the formula, each error against twice torch's own bf16 autograd error plus a
floor (the bound of tests/test_attention_bwd_ops.py), for both schedules (deterministic: the dQ
pass; not: dQ added with atomics), deterministic reruns against each other and the atomic dK / dV
against the deterministic ones bit for bit; then backward times of both at B*S = 16K tokens,
H = 32/8, D = 128 next to SDPA flash and cuDNN. Writes $OUT/bwd_probe.json (or /tmp).

    python attention/benchmarks/probe/bwd_probe.py      (on a GPU machine with CUDA torch)
"""

import glob
import json
import os
import time

import torch
import torch.nn.functional as F
from probe_common import ROOT, alibi_slopes, bench, formula, sdpa_backward_ms, within_bound
from torch.utils.cpp_extension import load

os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"
t0 = time.time()
KERNEL_SRC = os.path.join(ROOT, "attention/kernel_src")
ext = load(
    "attn_bwd_probe",
    [
        os.path.join(os.path.dirname(__file__), "bwd_probe_binding.cpp"),
        os.path.join(KERNEL_SRC, "attention_bwd.cu"),
        *sorted(glob.glob(os.path.join(KERNEL_SRC, "attention_bwd_hdim*.cu"))),
    ],
    extra_include_paths=[KERNEL_SRC],
    extra_cuda_cflags=["-O3", "-std=c++17"],
    verbose=False,
)
print(f"built in {time.time() - t0:.0f} s", flush=True)


CASES = [  # B, Sq, Sk, H, Hk, D, causal, window, softcap, alibi
    (2, 37, 37, 4, 4, 32, False, (-1, -1), 0.0, False),
    (2, 150, 150, 4, 2, 64, True, (-1, -1), 0.0, False),
    (2, 130, 200, 4, 1, 128, False, (70, 10), 0.0, False),
    (2, 200, 90, 2, 2, 96, True, (-1, -1), 0.0, False),
    (2, 129, 129, 4, 2, 128, True, (-1, -1), 20.0, True),
    (1, 300, 300, 2, 2, 40, True, (-1, -1), 0.0, False),
    (2, 64, 64, 2, 2, 128, False, (-1, -1), 0.0, False),
]
dev, dt = "cuda", torch.bfloat16
# The binding's `deterministic`: the dQ pass, or dQ added with atomics (AttnBwdParams::dq_accum)
VARIANTS = {"deterministic": True, "atomic": False}
results = []
for case in CASES:
    B, sq, sk, h, hk, d, causal, window, cap, al = case
    g = torch.Generator(device="cpu").manual_seed(sq + d)
    q, k, v = (
        torch.randn(s, generator=g).to(dev) for s in [(B, sq, h, d), (B, sk, hk, d), (B, sk, hk, d)]
    )
    dout = torch.randn(B, sq, h, d, generator=g).to(dev)
    slopes = alibi_slopes(h, dev) if al else None
    opts = dict(scale=d**-0.5, causal=causal, window=window, softcap=cap, slopes=slopes)
    leaves64 = [t.double().requires_grad_() for t in (q, k, v)]
    out64, lse64 = formula(*leaves64, **opts)
    out64.backward(dout.double())
    leaves16 = [t.to(dt).requires_grad_() for t in (q, k, v)]
    out16, _ = formula(*leaves16, **opts)
    out16.backward(dout.to(dt))
    qb, kb, vb = (t.to(dt).contiguous() for t in (q, k, v))
    out_b = out64.detach().to(dt).contiguous()
    lse = lse64.detach().float().contiguous()
    by_variant = {}
    for variant, deterministic in [*VARIANTS.items(), ("rerun", True)]:
        grads = [torch.full_like(t, float("nan")) for t in (qb, kb, vb)]
        ext.bwd(
            qb,
            kb,
            vb,
            out_b,
            lse,
            dout.to(dt).contiguous(),
            *grads,
            d**-0.5,
            causal,
            window[0],
            window[1],
            cap,
            slopes,
            deterministic,
        )
        by_variant[variant] = grads
    torch.cuda.synchronize()
    row = {"case": str(case)}
    # Deterministic reruns are equal bit for bit, and so are the atomic schedule's dK and dV.
    det = by_variant["deterministic"]
    ok = all(torch.equal(a, b) for a, b in zip(det, by_variant["rerun"]))
    ok &= all(torch.equal(a, b) for a, b in zip(det[1:], by_variant["atomic"][1:]))
    row["bits_equal"] = ok
    for variant in VARIANTS:
        for name, got, l64, l16 in zip(("dq", "dk", "dv"), by_variant[variant], leaves64, leaves16):
            err, terr, within = within_bound(got, l64.grad, l16.grad)
            row[f"{variant} {name}"] = (err, terr)
            ok &= within
    row["ok"] = ok
    results.append(row)
    print(row, flush=True)


# timing: B*S = 16K, H 32/8, D 128, causal and not, S = 2048 and 8192
timing = []
for S, causal in [(2048, True), (2048, False), (8192, True)]:
    B, H, HK, D = 16384 // S, 32, 8, 128
    q = torch.randn(B, S, H, D, device=dev, dtype=dt)
    k = torch.randn(B, S, HK, D, device=dev, dtype=dt)
    v = torch.randn(B, S, HK, D, device=dev, dtype=dt)
    dout = torch.randn_like(q)
    qs, ks, vs = (t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=True)
    out_b = out.detach().transpose(1, 2).contiguous()
    lse = torch.zeros(B, H, S, device=dev)  # values do not matter for timing
    grads = [torch.empty_like(t) for t in (q, k, v)]
    ours = {
        variant: bench(
            lambda deterministic=deterministic: ext.bwd(
                q,
                k,
                v,
                out_b,
                lse,
                dout,
                *grads,
                D**-0.5,
                causal,
                -1,
                -1,
                0.0,
                None,
                deterministic,
            )
        )
        for variant, deterministic in VARIANTS.items()
    }
    res = sdpa_backward_ms(qs, ks, vs, dout, causal)
    flops = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)
    row = {"S": S, "causal": causal, **res}
    for variant, ms in ours.items():
        row[f"ours_{variant}_ms"] = ms
        row[f"ours_{variant}_tflops"] = flops / ms / 1e9
    timing.append(row)
    print(row, flush=True)
json.dump(
    {"correct": results, "timing": timing},
    open(os.path.join(os.environ.get("OUT", "/tmp"), "bwd_probe.json"), "w"),
    indent=1,
)
