"""Sweep of the rope ops against eager PyTorch and torch.compile, same run (CUDA).

    python rope/benchmarks/sweep.py [--quick] [--out PATH] [--budget-s S]

Loads the *built* kernel (rope/build, via kernels.get_local_kernel, as the other sweeps do),
measures the copy ceiling, checks each op against the fp32 reference of benchmark.py before
timing it, then times ours and the baselines in the same process:

  op                      ours                                   baselines
  rotary_embedding        rotary_embedding(positions, q, k,      eager: transformers-style rotate_half on q and
                          head_dim, cos_sin_cache, True), in     k (cos/sin rows gathered by positions, cast to
                          place on the q and k column views of   bf16, new tensors); compile: torch.compile of
                          a fused qkv buffer [T, (32+16) * D]    that; inplace_eager: vLLM's native formulation
                                                                 (gather rows, rotate the q/k views, write them
                                                                 back in place); inplace_compile: compiled
  apply_rotary_transformers  apply_rotary_transformers(q, k,     eager: transformers' apply_rotary_pos_emb
                          cos, sin) -> new q, k; q [1, 32, S, D] (q * cos + rotate_half(q) * sin, bf16);
                          (transposed projection view), cos/sin  compile: torch.compile of it
                          [1, S, D] bf16

Sizes: tokens {1, 4, 16, 64, 256, 1024, 4096, 16384, 65536} x head_dim {64, 128, 256}, 32 query
heads / 8 kv heads, bf16 activations, fp32 cos_sin_cache, NeoX pairs; the transformers form at
tokens {1, 4096, 16384} x head_dim 128. --quick: head_dim 128, tokens {1, 64, 4096, 65536}, and
the transformers form at 4096. torch.compile: default mode, dynamic=False, compiled once per shape
(compile time not timed); cases run in priority order (the README's rows first) and the sweep
starts no new case once --budget-s, counted from process start, would be exceeded (skipped cases
are listed in the result file; --budget-s 0 runs them all). Writes
benchmarks/results/<device>.json with device, versions and commit (scripts/benchlib.py).
"""

from __future__ import annotations

import time

_START = time.perf_counter()  # the time budget counts imports and compilation too

import functools  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

KERNEL_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(KERNEL_DIR.parent / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark import (  # noqa: E402
    INPUT_SCALE,
    cos_sin_cache,
    reference_rotary_embedding,
    reference_transformers,
    rotate_half,
)

import benchlib  # noqa: E402

DEVICE = "cuda"
TOKENS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536]
HEAD_DIMS = [64, 128, 256]
Q_HEADS, KV_HEADS = 32, 8
MAX_POSITIONS = 131072  # > the largest token count: every position is a distinct row
TRANSFORMERS_TOKENS = [1, 4096, 16384]
# The README's rows (scripts/bench_table.py ROW_FILTERS["rope"]), measured first.
HEADLINE_TOKENS = [1, 64, 4096, 65536]
HEADLINE_HEAD_DIM = 128
QUICK_TOKENS = [1, 64, 4096, 65536]
DECODE_MAX_TOKENS = 64  # per-call (wall) times up to here: decode sizes, where launches dominate
REP_MS = 10  # per measurement: 10 graph replays of ~REP_MS each (benchlib's default: 100)
BUDGET_S = {"full": 215.0, "quick": 75.0}  # leaves time for the final copy measurement and save

VLLM, HF = "rotary_embedding", "apply_rotary_transformers"
BASELINES = {
    VLLM: ("eager", "compile", "inplace_eager", "inplace_compile"),
    HF: ("eager", "compile"),
}

CONTENDERS = {
    VLLM: {
        "ours": "kernel.rotary_embedding(positions, q, k, head_dim, cos_sin_cache, True), in place on the q/k "
        "column views of a fused qkv buffer (re-applied to the same buffer)",
        "eager": "transformers-style: cos/sin rows gathered by positions, cast to bf16, duplicated to head_dim; "
        "q * cos + rotate_half(q) * sin for q and k, new tensors",
        "compile": "torch.compile of the eager code, dynamic=False",
        "inplace_eager": "vLLM's native formulation: rows gathered, o1 = x1 cos - x2 sin, o2 = x2 cos + x1 sin "
        "in bf16 on the q/k views, written back into the qkv buffer (copy_)",
        "inplace_compile": "torch.compile of the in-place code, dynamic=False",
    },
    HF: {
        "ours": "kernel.apply_rotary_transformers(q, k, cos, sin) -> new q, k",
        "eager": "transformers' apply_rotary_pos_emb: q * cos + rotate_half(q) * sin (bf16)",
        "compile": "torch.compile(apply_rotary_pos_emb), dynamic=False",
    },
}

METHOD = (
    "GPU time = median of 10 CUDA-graph replays, each of back-to-back calls filling about "
    f"{REP_MS} ms (triton do_bench_cudagraph); per-call time at <= {DECODE_MAX_TOKENS} tokens = "
    "median of back-to-back launches (triton do_bench), launch overhead included; bytes = q and k "
    "read once and written once, plus one cos/sin table row and one position per token "
    "(rotary_embedding: fp32 cache row of head_dim values, int64 position; "
    "apply_rotary_transformers: bf16 cos and sin [S, head_dim]); every contender's GB/s uses those "
    "bytes; inputs are not rotated: rows with l2_resident (bytes <= the device's L2, l2_bytes) replay "
    "on L2-resident data for every contender alike and may exceed the copy ceiling; each op is "
    "checked against an fp32 reference before timing; copy ceiling = 1 GiB device-to-device copy "
    "after a clock warm-up, best of before and after the sweep, same run; torch.compile: default "
    "mode, dynamic=False, one compilation per shape, compile time excluded"
)
BASELINES_NOTE = (
    "rotary_embedding rows: ours in place on a fused qkv buffer vs transformers-style rotate_half "
    "(out of place, eager and torch.compile) and vLLM's native in-place formulation (eager and "
    "torch.compile), cos/sin rows gathered by positions in each; apply_rotary_transformers rows: "
    "transformers' apply_rotary_pos_emb, eager and torch.compile"
)


# ---- the code users run today (baselines) ----


def rope_rotate_half(q, k, positions, cache):
    """transformers-style RoPE on vLLM-layout q [T, Hq * D], k [T, Hk * D]: rows of the fp32 cache
    gathered by positions, cast to the activation dtype, new tensors."""
    head_dim = cache.shape[-1]
    cos, sin = cache[positions].chunk(2, dim=-1)
    cos = torch.cat([cos, cos], dim=-1).to(q.dtype).unsqueeze(-2)  # [T, 1, D]
    sin = torch.cat([sin, sin], dim=-1).to(q.dtype).unsqueeze(-2)
    qs = q.unflatten(-1, (-1, head_dim))
    ks = k.unflatten(-1, (-1, head_dim))
    return qs * cos + rotate_half(qs) * sin, ks * cos + rotate_half(ks) * sin


def rope_in_place(qkv, positions, cache, q_size: int, kv_size: int):
    """vLLM's RotaryEmbedding.forward_native (NeoX, full rotary), writing the results back into
    the q and k columns of the fused qkv buffer."""
    head_dim = cache.shape[-1]
    q, k, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    cos, sin = cache.index_select(0, positions).chunk(2, dim=-1)
    cos = cos.unsqueeze(-2).to(qkv.dtype)  # [T, 1, D/2]
    sin = sin.unsqueeze(-2).to(qkv.dtype)
    for x in (q, k):
        xs = x.unflatten(-1, (-1, head_dim))
        x1, x2 = xs.chunk(2, dim=-1)
        o1 = x1 * cos - x2 * sin
        o2 = x2 * cos + x1 * sin
        xs.copy_(torch.cat((o1, o2), dim=-1))


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' apply_rotary_pos_emb (models/llama/modeling_llama.py)."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


# Verification bound (benchlib.check_close): `want` is the fp32 reference rounded once, as the
# kernel's result is; the two fp32 values may differ in their last bits (evaluation order, FMA),
# which can move a rounding by one ulp.
check = functools.partial(benchlib.check_close, ulps=1.0, rms_ulps=1.0)


# ---- cases ----


@dataclass(frozen=True)
class Case:
    op: str
    dtype: str  # torch dtype name, e.g. "bfloat16"
    tokens: int
    head_dim: int
    q_heads: int = Q_HEADS
    kv_heads: int = KV_HEADS

    @property
    def label(self) -> str:
        return (
            f"{self.op} {self.dtype} {self.tokens}x({self.q_heads}+{self.kv_heads})x{self.head_dim}"
        )


def cases(quick: bool) -> list[Case]:
    """Every case, in priority order: the README's rows (head_dim 128, headline token counts,
    both forms), then the other token counts at 128, then head_dim 64 and 256. A time-budget cut
    removes the end of this list."""
    bf16 = "bfloat16"
    if quick:
        return [Case(VLLM, bf16, t, HEADLINE_HEAD_DIM) for t in QUICK_TOKENS] + [
            Case(HF, bf16, 4096, HEADLINE_HEAD_DIM)
        ]
    ordered = [Case(VLLM, bf16, t, HEADLINE_HEAD_DIM) for t in HEADLINE_TOKENS]
    ordered += [Case(HF, bf16, t, HEADLINE_HEAD_DIM) for t in TRANSFORMERS_TOKENS]
    ordered += [Case(VLLM, bf16, t, HEADLINE_HEAD_DIM) for t in TOKENS if t not in HEADLINE_TOKENS]
    for d in HEAD_DIMS:
        if d != HEADLINE_HEAD_DIM:
            ordered += [Case(VLLM, bf16, t, d) for t in TOKENS]
    return ordered


def _bytes(case: Case, element: int) -> int:
    """Bytes each op must move (see METHOD)."""
    qk = case.tokens * (case.q_heads + case.kv_heads) * case.head_dim * element
    if case.op == VLLM:
        return 2 * qk + case.tokens * (
            case.head_dim * 4 + 8
        )  # q, k in and out; fp32 row; int64 position
    return 2 * qk + 2 * case.tokens * case.head_dim * element  # q, k in and out; cos and sin


def run_vllm(kernel, case: Case, dtype: torch.dtype) -> tuple[dict, dict]:
    tag = f"{case.dtype}_{case.tokens}_{case.head_dim}"
    d = case.head_dim
    q_size, kv_size = case.q_heads * d, case.kv_heads * d
    qkv = INPUT_SCALE * torch.randn(case.tokens, q_size + 2 * kv_size, dtype=dtype, device=DEVICE)
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    positions = torch.randperm(MAX_POSITIONS, device=DEVICE)[: case.tokens]
    cache = cos_sin_cache(MAX_POSITIONS, d, DEVICE)

    # Verify before timing: ours (in place) against the fp32 reference; v untouched.
    q0, k0, v0 = q.clone(), k.clone(), v.clone()
    kernel.rotary_embedding(positions, q, k, d, cache, True)
    check(case.label + " query", q, reference_rotary_embedding(positions, q0, d, cache))
    check(case.label + " key", k, reference_rotary_embedding(positions, k0, d, cache))
    if not torch.equal(v, v0):
        raise SystemExit(f"verification failed for {case.label}: value columns changed")
    # The baselines compute the same rotation in bf16 steps (cos/sin and each product rounded):
    # compared as a whole, a wrong formula (not their rounding) would show here.
    want_q = reference_rotary_embedding(positions, q, d, cache).float()
    got_q = rope_rotate_half(q, k, positions, cache)[0].flatten(-2).float()
    qkv_copy = qkv.clone()
    rope_in_place(qkv_copy, positions, cache, q_size, kv_size)
    for name, got in (("eager", got_q), ("inplace_eager", qkv_copy[:, :q_size].float())):
        err = ((got - want_q).norm() / want_q.norm().clamp_min(1e-30)).item()
        if not err <= 2.0**-6:
            raise SystemExit(
                f"baseline {name} disagrees with the reference for {case.label}: relative error {err}"
            )
    del q0, k0, v0, want_q, got_q, qkv_copy

    compiled_oop = benchlib.compiled(rope_rotate_half, tag)
    compiled_inplace = benchlib.compiled(rope_in_place, tag)
    # Every contender re-applies to the same buffer (a rotation keeps the values bounded).
    timed = {
        "ours": lambda: kernel.rotary_embedding(positions, q, k, d, cache, True),
        "eager": lambda: rope_rotate_half(q, k, positions, cache),
        "compile": lambda: compiled_oop(q, k, positions, cache),
        "inplace_eager": lambda: rope_in_place(qkv, positions, cache, q_size, kv_size),
        "inplace_compile": lambda: compiled_inplace(qkv, positions, cache, q_size, kv_size),
    }
    us = {name: benchlib.gpu_time_us(fn, rep_ms=REP_MS) for name, fn in timed.items()}
    wall = {}
    if case.tokens <= DECODE_MAX_TOKENS:
        # Decode sizes: a call costs its launch more than its GPU time; report what an eager
        # caller sees too (Python + dispatcher + launch; torch.compile adds its guards).
        wall = {
            name: benchlib.wall_time_us(timed[name], rep_ms=REP_MS)
            for name in ("ours", "compile", "inplace_compile")
        }
    if not bool(torch.isfinite(qkv).all()):
        raise SystemExit(f"{case.label}: the qkv buffer is not finite after timing")
    return us, wall


def run_transformers(kernel, case: Case, dtype: torch.dtype) -> tuple[dict, dict]:
    tag = f"hf_{case.dtype}_{case.tokens}_{case.head_dim}"
    d, s = case.head_dim, case.tokens
    q = (INPUT_SCALE * torch.randn(1, s, case.q_heads, d, dtype=dtype, device=DEVICE)).transpose(
        1, 2
    )
    k = (INPUT_SCALE * torch.randn(1, s, case.kv_heads, d, dtype=dtype, device=DEVICE)).transpose(
        1, 2
    )
    cos, sin = cos_sin_cache(s, d, DEVICE).chunk(2, dim=-1)
    cos = (
        torch.cat([cos, cos], dim=-1).to(dtype).unsqueeze(0)
    )  # [1, S, D], as LlamaRotaryEmbedding returns
    sin = torch.cat([sin, sin], dim=-1).to(dtype).unsqueeze(0)

    q_out, k_out = kernel.apply_rotary_transformers(q, k, cos, sin)
    check(case.label + " query", q_out, reference_transformers(q, cos, sin))
    check(case.label + " key", k_out, reference_transformers(k, cos, sin))
    del q_out, k_out

    compiled_fn = benchlib.compiled(apply_rotary_pos_emb, tag)
    timed = {
        "ours": lambda: kernel.apply_rotary_transformers(q, k, cos, sin),
        "eager": lambda: apply_rotary_pos_emb(q, k, cos, sin),
        "compile": lambda: compiled_fn(q, k, cos, sin),
    }
    us = {name: benchlib.gpu_time_us(fn, rep_ms=REP_MS) for name, fn in timed.items()}
    wall = {}
    if case.tokens <= DECODE_MAX_TOKENS:
        wall = {
            name: benchlib.wall_time_us(timed[name], rep_ms=REP_MS) for name in ("ours", "compile")
        }
    return us, wall


def run_case(kernel, case: Case, l2_bytes: int | None) -> dict:
    dtype = getattr(torch, case.dtype)
    us, wall = (run_vllm if case.op == VLLM else run_transformers)(kernel, case, dtype)
    return benchlib.timing_row(
        case, _bytes(case, torch.finfo(dtype).bits // 8), l2_bytes, us, wall, BASELINES[case.op]
    )


def _summary(r: dict) -> str:
    return benchlib.summary_line(
        f"{r['op']:26s} T={r['tokens']:6d} D={r['head_dim']:4d}", r, BASELINES[r["op"]]
    )


def parse_args(argv=None):
    parser = benchlib.sweep_arguments(
        __doc__.split("\n\n")[0], "head_dim 128, 4 token counts, one transformers size", BUDGET_S
    )
    return parser.parse_args(argv)


def main():
    args = parse_args()
    order = {VLLM: 0, HF: 1}
    benchlib.run_budgeted_sweep(
        kernel_name="rope",
        kernel_dir=KERNEL_DIR,
        start=_START,
        args=args,
        budget_s=BUDGET_S,
        cases=cases(args.quick),
        run_case=run_case,
        summary=_summary,
        sort_key=lambda r: (order[r["op"]], r["dtype"], r["head_dim"], r["tokens"]),
        notes={"method": METHOD, "baselines": BASELINES_NOTE, "contenders": CONTENDERS},
    )


if __name__ == "__main__":
    main()
