"""What the backward probes (bwd_probe.py, sm90_bwd_probe.py) share: the reference formula (and
the test cases' ALiBi slopes), the gradient bound of tests/test_attention_bwd_ops.py, the timer
and SDPA's backward times."""

import os
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "attention", "tests"))
from attention_cases import alibi_slopes, bias, visible  # noqa: E402, F401 (alibi_slopes: bwd_probe)


def formula(q, k, v, scale, causal, window=(-1, -1), softcap=0.0, slopes=None):
    """[B, S, H, D] -> out, lse ([B, H, S_q]) in q's dtype (lse float32 of it)."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    qt = q.transpose(1, 2)
    kt = k.repeat_interleave(h // hk, dim=2).transpose(1, 2)
    vt = v.repeat_interleave(h // hk, dim=2).transpose(1, 2)
    s = (qt @ kt.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    bb = bias(sq, sk, slopes)
    if bb is not None:
        s = s + bb.to(s.device, s.dtype)
    mask = visible(sq, sk, causal, window).to(s.device)
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return (p @ vt).transpose(1, 2), lse


def within_bound(got, want, theirs):
    """(error, torch's error, ok): got against the float64 gradient `want`, within twice the
    error of torch's bf16 autograd (`theirs`) plus 8 bf16 ulp of the largest gradient."""
    err = float((got.double() - want).abs().max())
    terr = float((theirs.double() - want).abs().max())
    floor = 8 * 2**-8 * float(want.abs().max())
    return round(err, 5), round(terr, 5), err <= 2 * terr + floor


def bench(fn, iters=10):
    """ms per call of fn, after 3 warm-up calls (CUDA events around back-to-back calls)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / iters


def sdpa_backward_ms(qs, ks, vs, dout, causal):
    """{"flash": ms, "cudnn": ms} of SDPA's backward on [B, H, S, D] leaves (K / V expanded to
    q's heads), dout [B, S, H, D]; a backend that rejects the call gets its error instead."""
    group = qs.shape[1] // ks.shape[1]
    ks_r, vs_r = (t.detach().repeat_interleave(group, 1).requires_grad_() for t in (ks, vs))
    res = {}
    for name, backend in [
        ("flash", torch.nn.attention.SDPBackend.FLASH_ATTENTION),
        ("cudnn", torch.nn.attention.SDPBackend.CUDNN_ATTENTION),
    ]:
        try:
            with torch.nn.attention.sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(qs, ks_r, vs_r, is_causal=causal)
                go = dout.transpose(1, 2)
                res[name] = bench(
                    lambda: torch.autograd.grad(o, (qs, ks_r, vs_r), go, retain_graph=True)
                )
        except Exception as e:  # noqa: BLE001
            res[name] = repr(e)[:80]
    return res
