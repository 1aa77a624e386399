#!/usr/bin/env python3
"""Host time per call of each kit op and of its PyTorch counterpart: what the CPU spends to
issue one call, the part of a model step that the GPU cannot hide once the host falls behind.

    python scripts/host_cost.py [--device cuda] [--tokens 2048] [--calls 100] [--out F.json]

On CUDA a long sleep kernel holds the stream first, so N calls only enqueue their work and the
wall time of the N calls is host time alone (N is kept below the launch queue's depth). On the
CPU the figure is the whole call, kernel included. Shapes are those of one Llama-3-8B / Qwen3-8B
layer at `--tokens` tokens of one sequence (32 / 8 heads of 128, hidden 4096, MLP 12288), bf16.
The kit is loaded as scripts/e2e.py loads it (`<kernel>/build` through LOCAL_KERNELS).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e  # noqa: E402


def cases(kit: dict, device: str, tokens: int) -> dict:
    """name -> a call with its inputs bound (one layer's shapes)."""
    att, rms, rope, act = (kit[k] for k in ("attention", "rmsnorm", "rope", "activation"))
    bf = torch.bfloat16
    heads, kv_heads, dim, hidden, inter = 32, 8, 128, 4096, 12288

    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=bf)

    q, k, v = (
        randn(1, heads, tokens, dim),
        randn(1, kv_heads, tokens, dim),
        randn(1, kv_heads, tokens, dim),
    )
    q_bshd, k_bshd, v_bshd = (t.transpose(1, 2) for t in (q, k, v))
    x, w, out = (
        randn(tokens, hidden),
        torch.ones(hidden, device=device, dtype=bf),
        randn(tokens, hidden),
    )
    cos, sin = randn(1, tokens, dim), randn(1, tokens, dim)
    gate = randn(tokens, inter)
    scale = dim**-0.5
    return {
        "kit transformers_attention_forward": lambda: att.transformers_attention_forward(
            None, q, k, v, None, scaling=scale, is_causal=True
        ),
        "kit flash_attn_func": lambda: att.flash_attn_func(q_bshd, k_bshd, v_bshd, causal=True),
        "torch scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True
        ),
        "kit rms_norm": lambda: rms.rms_norm(out, x, w, 1e-6),
        "torch F.rms_norm": lambda: F.rms_norm(x, (hidden,), w, 1e-6),
        "kit apply_rotary_pos_emb": lambda: rope.apply_rotary_pos_emb(q, k, cos, sin),
        "kit silu": lambda: act.silu(gate),
        "torch F.silu": lambda: F.silu(gate),
        "torch empty (floor)": lambda: torch.empty(16, device=device),
    }


def host_us(fn, device: str, calls: int) -> float:
    """Mean host microseconds per call of `fn` (module docstring)."""
    cuda = device == "cuda"
    for _ in range(5):
        fn()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda._sleep(int(3e9))  # about 1.5 s of a spinning kernel: longer than the calls
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    if cuda:
        torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--calls", type=int, default=100, help="calls timed per op (CUDA: <= 300)")
    p.add_argument("--out", type=Path, help="results JSON")
    args = p.parse_args(argv)
    if args.device == "cuda" and args.calls > 300:
        p.error(
            "--calls: at most 300 on CUDA (each call may launch three kernels, and the launch "
            "queue must not fill while the sleep kernel holds the stream)"
        )
    kit = e2e.load_kit()
    doc = {
        "environment": e2e.environment(args.device),
        "tokens": args.tokens,
        "calls": args.calls,
        "host_us": {},
    }
    for name, fn in cases(kit, args.device, args.tokens).items():
        doc["host_us"][name] = host_us(fn, args.device, args.calls)
        print(f"{name:40s} {doc['host_us'][name]:9.1f} us/call")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


if __name__ == "__main__":
    main()
